"""A stand-in pipeline (characters as tokens) whose loop is a row loop, and a uvicorn server in a thread.

`FakePipeline` keeps `Pipeline`'s public surface that the server uses (encode, encode_messages, check_room,
request_sampling, row_request, row_loop, max_batch, tokenizer, eos_token_ids, config, target.n_positions). Its
`row_loop` is `ScriptedRows`, a `RowLoop` (engines/rows.py) of real `Row`s in real `RowSlots`: the server's
scheduler (admission between steps, cancels, deadlines, the drain) runs as in production, and only the target's
calls are scripted, with timing the test controls. So the HTTP layer is tested in milliseconds;
tests/test_serve_embedded.py runs the same server on the embedded model.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import torch
import uvicorn
from fastapi import FastAPI

from neuron_ssp.config import SamplingConfig, ServeConfig, load_config
from neuron_ssp.drafters.base import Draft, point_masses
from neuron_ssp.engines.base import GenerationResult, check_room, sampling_params
from neuron_ssp.engines.rows import Row, RowCallbacks, RowRequest, RowSettings, RowSlots, run_alone
from neuron_ssp.errors import Problem
from neuron_ssp.pipeline.build import engine_controls_problems
from neuron_ssp.pipeline.pipeline import Pipeline
from neuron_ssp.pipeline.prompt_length import PromptLimit
from neuron_ssp.pipeline.prompts import ChatTurn, encode_messages, encode_prompt
from neuron_ssp.serve.app import create_app
from neuron_ssp.serve.served_pipeline import ServedPipeline
from neuron_ssp.speculation.controls import RequestControls, value_problems
from neuron_ssp.speculation.position_noise import PositionNoise

EOS = 0
WINDOW = 3  # tokens a step commits per row: 2 accepted drafts + the target's own token
K = 4


class CharTokenizer:
    chat_template = None

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        return {"input_ids": [ord(c) for c in text]}

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(i) for i in ids if i != EOS)

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str]:
        return [chr(i) for i in ids]


class ScriptedReply:
    """A row's drafter that knows the reply: it proposes the reply's next tokens (the stand-in target then
    accepts all of a window but the last, where its own token is the reply's)."""

    def __init__(self, ids: list[int]):
        self.ids = ids
        self.prompt_len = 0

    def begin(self, prompt_ids: torch.Tensor, max_new_tokens: int, noise: PositionNoise | None = None) -> None:
        self.prompt_len = int(prompt_ids.shape[0])

    def propose(self, sequence: torch.Tensor, max_tokens: int) -> Draft:
        start = int(sequence.shape[0]) - self.prompt_len
        tokens = torch.tensor(self.ids[start : start + max_tokens], dtype=torch.long)
        return Draft(tokens, point_masses(tokens, max(self.ids) + 1), deterministic=True)

    def finish(self, sequence: torch.Tensor) -> None:
        pass


def scripted(row: Row) -> ScriptedReply:
    """The row's reply, which FakePipeline gives every row as its drafter."""
    assert isinstance(row.drafter, ScriptedReply)
    return row.drafter


def made_up_logits(tokens: list[int]) -> torch.Tensor:
    """The 'target's' logits for `tokens`: the chosen token 0, every other one -10."""
    rows = torch.full((len(tokens), max(tokens) + 1), -10.0)
    rows[torch.arange(len(tokens)), torch.tensor(tokens)] = 0.0
    return rows


class ScriptedRows(RowSlots):
    """The stand-in's RowLoop, over its own slots. `join` prefills (`pipeline.prefill_s_per_token` per prompt
    token, after `pipeline.hold` is set when the test holds prefills back) and commits the reply's first token;
    each `step` takes `pipeline.step_s` and commits up to WINDOW tokens per running row. Rows whose caller no
    longer wants them leave before a step (`pipeline.cancelled` is set then). `pipeline.error` is raised by the
    prefill (`error_at` "join") or becomes a row's own error in a step ("step"), as the real loop's failures do."""

    def __init__(self, pipeline: FakePipeline, slots: int):
        super().__init__(slots)
        self.pipeline = pipeline

    free_slots = RowSlots.free  # RowLoop's name for it
    prefix_pool_bytes = 0  # it keeps no prefix pool

    def join(self, request: RowRequest) -> Row:
        check_room(self.pipeline.target, request.prompt_ids.shape[0], request.max_new_tokens, "target.n_positions")
        return self.start(lambda slot: Row(request, slot, K, 256), self._prefill)

    def step(self) -> list[Row]:
        cancelled = self.leave_cancelled()
        if cancelled:
            self.pipeline.cancelled.set()
        if not self.rows:
            return cancelled
        time.sleep(self.pipeline.step_s)
        for row in self.rows:
            if self.pipeline.error is not None and self.pipeline.error_at == "step":
                row.error = self.pipeline.error
                continue
            draft = scripted(row).propose(row.seq.committed(), WINDOW)
            tokens = draft.tokens.tolist()
            accepted = len(tokens) - 1
            row.stats.record_call(
                len(tokens), accepted, row.seq.extend(tokens, accepted, len(tokens), made_up_logits(tokens))
            )
        return cancelled + self.leave_finished()

    def run(self, request: RowRequest) -> GenerationResult:
        return run_alone(self, request)

    def _prefill(self, row: Row) -> None:
        pipeline = self.pipeline
        pipeline.prefilling.set()
        if pipeline.hold is not None:
            pipeline.hold.wait(30)
        time.sleep(pipeline.prefill_s_per_token * row.seq.prompt_len)
        if pipeline.error is not None and pipeline.error_at == "join":
            raise pipeline.error
        reply = scripted(row)
        reply.begin(row.request.prompt_ids, row.request.max_new_tokens)
        first = [reply.ids[0]]
        row.seq.extend(first, logits=made_up_logits(first))


class FakePipeline:
    """Answers with `reply` (or the prompt reversed) then EOS: its first token at the prefill, then steps of up to
    3 tokens (2 accepted drafts + 1 target). `max_batch` rows at once (serve.max_batch of its config)."""

    def __init__(
        self,
        reply: str | None = None,
        step_s: float = 0.0,
        n_positions: int = 256,
        max_batch: int = 8,
        prefill_s_per_token: float = 0.0,
        tokenizer: Any = None,
        engine: str = "native",
    ):
        self.config = load_config(None, {"serve.max_batch": max_batch})
        self.max_batch = max_batch
        self.tokenizer: Any = tokenizer or CharTokenizer()
        self.eos_token_ids = {EOS}
        self.target = SimpleNamespace(n_positions=n_positions, max_score_width=None, vocab_size=0x110000)  # characters
        # the engine whose refusals of RequestControls it answers with (native: none; the scripted loop ignores them)
        self.engine_config = self.config.model_copy(
            update={"speculation": self.config.speculation.model_copy(update={"engine": engine})}
        )
        self.reply = reply
        self.step_s = step_s
        self.prefill_s_per_token = prefill_s_per_token
        self.hold: threading.Event | None = None  # set: prefills wait for it
        self.prefilling = threading.Event()  # a prefill has started
        self.cancelled = threading.Event()  # a row left because its caller stopped it
        self.error: Exception | None = None
        self.error_at = "join"
        self.calls: list[dict] = []

    def encode(self, prompt: str, chat_template: bool | None = None, limit: PromptLimit | None = None) -> torch.Tensor:
        return encode_prompt(self.tokenizer, prompt, False, limit)

    def encode_messages(
        self,
        messages: list[dict[str, Any]],
        limit: PromptLimit | None = None,
        turn: ChatTurn = ChatTurn(),
        tools: list[dict[str, Any]] | None = None,
    ) -> torch.Tensor:
        return encode_messages(self.tokenizer, messages, True, limit, turn, tools)  # the template, where there is one

    template_renders_tools = Pipeline.template_renders_tools  # the real one: it reads the tokenizer and .config

    extra_slots = 0  # the native loop's rule
    prompt_limit = Pipeline.prompt_limit  # the real one: it reads target.n_positions, extra_slots and the tokenizer
    scores_tokens = True
    request_sampling = Pipeline.request_sampling  # the real merge of a request's fields (it reads only .config)

    def check_room(self, prompt_ids: torch.Tensor, max_new_tokens: int) -> None:
        check_room(self.target, prompt_ids.shape[0], max_new_tokens, "target.n_positions")

    def row_loop(self) -> ScriptedRows:
        return ScriptedRows(self, self.config.serve.max_batch)

    def controls_problems(self, controls: RequestControls) -> list[Problem]:
        """Pipeline's, less the grammar's compilation (the scripted loop applies no control)."""
        return value_problems(controls, self.target.vocab_size) + engine_controls_problems(self.engine_config, controls)

    def row_request(
        self,
        prompt_ids: torch.Tensor,
        max_new_tokens: int,
        sampling: SamplingConfig,
        callbacks: RowCallbacks,
        controls: RequestControls = RequestControls(),
    ) -> RowRequest:
        self.calls.append(
            {"max_new_tokens": max_new_tokens, "sampling": sampling, "controls": controls, "prompt_ids": prompt_ids}
        )
        text = self.reply if self.reply is not None else "".join(chr(int(i)) for i in prompt_ids.flip(0))
        reply = ScriptedReply([ord(c) for c in text] + [EOS])
        settings = RowSettings(sampling_params(sampling), sampling.seed, lambda slot: reply)
        heard = RowCallbacks(
            on_commit=callbacks.on_commit, on_logits=callbacks.on_logits, should_stop=callbacks.should_stop
        )
        return RowRequest(prompt_ids, max_new_tokens, self.eos_token_ids, settings, heard)


# the type checker holds the stand-in against what the server takes (CI runs mypy over this file)
STANDS_IN_FOR: type[ServedPipeline] = FakePipeline


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def serving(pipeline: ServedPipeline, api_key: str | None = None, **settings: Any) -> Iterator[tuple[str, FastAPI]]:
    """The app on 127.0.0.1 in a background thread; yields its base URL and the app (its worker, its metrics)."""
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
        yield f"http://127.0.0.1:{port}", app
    finally:
        server.should_exit = True
        thread.join(10)


@contextmanager
def running_server(pipeline: ServedPipeline, api_key: str | None = None, **settings: Any) -> Iterator[str]:
    """The app on 127.0.0.1 in a background thread; yields its base URL."""
    with serving(pipeline, api_key, **settings) as (url, _):
        yield url
