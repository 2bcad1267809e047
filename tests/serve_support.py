"""A stand-in pipeline (characters as tokens, scripted origins) and a uvicorn server in a thread.

The fake keeps `Pipeline`'s public surface that the server uses (encode, encode_messages, check_room,
generate_ids, tokenizer, eos_token_ids, config, target.n_positions), so the HTTP layer is tested in
milliseconds; tests/test_serve_embedded.py runs the same server on the embedded model.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace

import torch
import uvicorn

from neuron_ssp.config import ServeConfig, load_config
from neuron_ssp.engines.base import check_room
from neuron_ssp.pipeline.pipeline import Pipeline
from neuron_ssp.pipeline.prompts import encode_messages, encode_prompt
from neuron_ssp.serve.app import create_app
from neuron_ssp.speculation.stats import GenerationStats

EOS = 0


class CharTokenizer:
    chat_template = None

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        return {"input_ids": [ord(c) for c in text]}

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(i) for i in ids if i != EOS)


class FakePipeline:
    """Answers with `reply` (or the prompt reversed), in steps of up to 3 tokens: 2 accepted drafts + 1 target."""

    def __init__(self, reply: str | None = None, step_s: float = 0.0, n_positions: int = 256):
        self.config = load_config(None)
        self.tokenizer = CharTokenizer()
        self.eos_token_ids = {EOS}
        self.target = SimpleNamespace(n_positions=n_positions, max_score_width=None)
        self.reply = reply
        self.step_s = step_s
        self.cancelled = threading.Event()
        self.calls: list[dict] = []

    def encode(self, prompt: str, chat_template: bool | None = None) -> torch.Tensor:
        return encode_prompt(self.tokenizer, prompt, False)

    def encode_messages(self, messages: list[dict[str, str]]) -> torch.Tensor:
        return encode_messages(self.tokenizer, messages, False)

    extra_slots = 0  # the native loop's rule
    scores_tokens = True
    batches = False  # answers through generate_ids, one request at a time (the path of the libraries' engines)
    request_sampling = Pipeline.request_sampling  # the real merge of a request's fields (it reads only .config)

    def check_room(self, prompt_ids: torch.Tensor, max_new_tokens: int) -> None:
        check_room(self.target, prompt_ids.shape[0], max_new_tokens, "target.n_positions")

    def generate_ids(self, prompt_ids, max_new_tokens, sampling=None, on_commit=None, should_stop=None, on_logits=None):
        self.calls.append({"max_new_tokens": max_new_tokens, "sampling": sampling})
        text = self.reply if self.reply is not None else "".join(chr(int(i)) for i in prompt_ids.flip(0))
        ids = [ord(c) for c in text][:max_new_tokens]
        if len(ids) < max_new_tokens:
            ids.append(EOS)
        stats = GenerationStats(k=4)
        done: list[int] = []
        first = True
        while len(done) < len(ids):
            if should_stop and should_stop():
                self.cancelled.set()
                break
            time.sleep(self.step_s)
            step = ids[len(done) : len(done) + (1 if first else 3)]
            accepted = len(step) - 1
            if not first:
                stats.record_call(min(3, len(step) + 1), accepted, len(step))
            done += step
            if on_logits:  # made-up logits: the chosen token 0, every other one -10
                rows = torch.full((len(step), max(step) + 1), -10.0)
                rows[torch.arange(len(step)), torch.tensor(step)] = 0.0
                on_logits(rows)
            if on_commit:
                on_commit(step, accepted, 0 if first else min(3, len(step) + 1))
            first = False
        stats.new_tokens = len(done)
        return SimpleNamespace(tokens=done, stats=stats)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def running_server(pipeline, api_key: str | None = None, **settings) -> Iterator[str]:
    """The app on 127.0.0.1 in a background thread; yields its base URL."""
    serve = ServeConfig(**settings)
    app = create_app(pipeline, serve, "fake-model", api_key)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
