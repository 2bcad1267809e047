"""Helpers for the tune-k / eval / bench tests: a character tokenizer and pipelines on tiny models."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from conftest import TINY_VOCAB, tiny_llama

from neuron_ssp.backends.base import ModelBackend
from neuron_ssp.backends.torch.scoring import TorchBackend
from neuron_ssp.config import Config, config_from_dict
from neuron_ssp.pipeline.build import build_generator, share
from neuron_ssp.pipeline.pipeline import Pipeline
from neuron_ssp.serve.capacity import serving_batch

EOS = 2


class CharTokenizer:
    """One token per character (ids 3..vocab-1): enough for the tools, which only encode and decode."""

    chat_template = None
    eos_token_id = EOS
    unk_token_id = None

    def __init__(self, vocab_size: int = TINY_VOCAB):
        self.vocab_size = vocab_size

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        return {"input_ids": [3 + ord(ch) % (self.vocab_size - 3) for ch in text]}

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(32 + i % 90) for i in ids if i != EOS or not skip_special_tokens)

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str]:
        return [self.decode([i], skip_special_tokens=False) for i in ids]


def tiny_config(**sections: Any) -> Config:
    data: dict[str, Any] = {
        "target": {"path": "unused-in-these-tests", "n_positions": 512},
        "speculation": {"k": 4, "drafter": "ngram"},
        "generation": {"max_new_tokens": 12},
    }
    for name, values in sections.items():
        data[name] = {**data.get(name, {}), **values}
    return config_from_dict(data)


def pipeline_on(target: ModelBackend, config: Config, tokenizer: Any = None, eos: set[int] | None = None) -> Pipeline:
    """What load_pipeline would build for a server, around an already loaded target (the draft is the ngram
    drafter): as many rows at once as the config serves."""
    shared = share(config, target, None)
    return Pipeline(
        config,
        tokenizer or CharTokenizer(),
        target,
        None,
        build_generator(config, target, None, shared),
        eos or {EOS},
        shared,
        serving_batch(config),
    )


def tiny_pipeline(config: Config | None = None) -> Pipeline:
    return pipeline_on(TorchBackend(tiny_llama(0), 512), config or tiny_config())


def write_prompts(path: Path, rows: list[tuple[str, str]]) -> Path:
    path.write_text("".join(json.dumps({"category": c, "prompt": p}) + "\n" for c, p in rows))
    return path


# A repetitive text: prompt lookup finds matches in it, so the drafter proposes.
REPETITIVE = "abcabcabd abcabcabd abcabc " * 3
PROMPT_ROWS = [
    ("copy", REPETITIVE),
    ("copy", "xyz xyz xyz xyz"),
    ("open", "tell me something new"),
    ("open", "a quick question"),
]
