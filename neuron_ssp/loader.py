"""Config -> ready pipeline: validate first, then load models, drafter, acceptor and policy.

Nothing loads from an invalid config: topology, placement and memory are checked before any weight
is read (on Neuron, before paying for a compile).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
from transformers import AutoTokenizer, PreTrainedTokenizerBase
from transformers.utils import logging as transformers_logging

from neuron_ssp.acceptors import TokenAcceptor, build_acceptor
from neuron_ssp.backends.base import ModelBackend
from neuron_ssp.config import Config, ModelConfig
from neuron_ssp.drafters import Drafter, ModelDrafter, NgramDrafter, SuffixDrafter, SuffixHistory
from neuron_ssp.drafters.suffix_store import HistoryFile
from neuron_ssp.embedded import resolve_model_path
from neuron_ssp.errors import Problem, UsageError
from neuron_ssp.generator import GenerationResult, SpeculativeGenerator, plain_generate, sampling_params
from neuron_ssp.policies import build_policy
from neuron_ssp.prompts import encode_prompt, stop_token_ids
from neuron_ssp.topology import validate_config

TextCallback = Callable[[str], None]


class Generator(Protocol):
    """What a pipeline drives: our SpeculativeGenerator or the library engine."""

    def generate(self, prompt_ids: torch.Tensor, max_new_tokens: int, eos_token_ids: Collection[int] = (),
                 on_tokens: Callable[[list[int]], None] | None = None) -> GenerationResult: ...


@dataclass
class TextResult:
    text: str
    tokens: list[int]
    result: GenerationResult


@dataclass
class Pipeline:
    """Everything one generation needs; `speculative` and `plain` share the same target backend."""

    config: Config
    tokenizer: PreTrainedTokenizerBase
    target: ModelBackend
    draft: ModelBackend | None
    generator: Generator
    eos_token_ids: set[int]

    def encode(self, prompt: str) -> torch.Tensor:
        return encode_prompt(self.tokenizer, prompt, self.config.generation.chat_template)

    def speculative(self, prompt: str, on_text: TextCallback | None = None,
                    max_new_tokens: int | None = None) -> TextResult:
        streamer = TextStream(self.tokenizer, on_text) if on_text else None
        result = self.generator.generate(self.encode(prompt), max_new_tokens or self.config.generation.max_new_tokens,
                                         self.eos_token_ids, streamer)
        return self._text(result)

    def plain(self, prompt: str, on_text: TextCallback | None = None,
              max_new_tokens: int | None = None) -> TextResult:
        streamer = TextStream(self.tokenizer, on_text) if on_text else None
        result = plain_generate(self.target, self.encode(prompt),
                                max_new_tokens or self.config.generation.max_new_tokens,
                                self.config.sampling, self.eos_token_ids, streamer)
        return self._text(result)

    def _text(self, result: GenerationResult) -> TextResult:
        return TextResult(self.tokenizer.decode(result.tokens, skip_special_tokens=True), result.tokens, result)


class TextStream:
    """Turns committed token ids into printable text deltas (re-decoding keeps multi-byte chars whole)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, on_text: TextCallback):
        self.tokenizer = tokenizer
        self.on_text = on_text
        self.tokens: list[int] = []
        self.printed = 0

    def __call__(self, tokens: list[int]) -> None:
        self.tokens.extend(tokens)
        text = self.tokenizer.decode(self.tokens, skip_special_tokens=True)
        if text.endswith("\ufffd"):
            return  # an incomplete UTF-8 sequence: wait for the next token
        self.on_text(text[self.printed:])
        self.printed = len(text)


def load_pipeline(config: Config) -> Pipeline:
    validate_config(config).raise_if_invalid()
    rng = torch.Generator()
    acceptor = build_acceptor(config.speculation.acceptor, sampling_params(config.sampling), rng)  # fail fast
    transformers_logging.disable_progress_bar()
    if config.platform.backend == "neuron":
        from neuron_ssp.backends.neuron import load_neuron_backends
        from neuron_ssp.topology import plan_deployment

        target, draft = load_neuron_backends(config, plan_deployment(config))
        tokenizer = AutoTokenizer.from_pretrained(str(resolve_model_path(config.target.path, "target.path")))
    else:
        target, draft, tokenizer = _load_torch(config)
    generation_config = getattr(getattr(target, "model", None), "generation_config", None)
    eos = stop_token_ids(tokenizer, config.generation.stop_tokens, getattr(generation_config, "eos_token_id", None))
    return Pipeline(config, tokenizer, target, draft, build_generator(config, target, draft, acceptor, rng), eos)


def build_generator(config: Config, target: ModelBackend, draft: ModelBackend | None, acceptor: TokenAcceptor,
                    rng: torch.Generator) -> Generator:
    """Our loop by default; transformers-neuronx's own loop with `engine: library` (Neuron only)."""
    if config.speculation.engine == "library":
        from neuron_ssp.backends.neuron_library import LibraryEngine

        return LibraryEngine.from_config(config, target, draft, acceptor, rng)
    return SpeculativeGenerator(target, build_drafter(config, target, draft), acceptor,
                                build_policy(config.speculation), config.sampling, config.speculation.k, rng)


def build_drafter(config: Config, target: ModelBackend, draft: ModelBackend | None) -> Drafter:
    spec = config.speculation
    if spec.drafter == "ngram":
        return NgramDrafter(target.vocab_size, spec.ngram_max, spec.ngram_min)
    if spec.drafter == "suffix":
        persist = spec.suffix.persist_path
        store = HistoryFile(persist, config.target.path, target.vocab_size) if persist else None
        return SuffixDrafter(target.vocab_size, spec.suffix, SuffixHistory(spec.suffix, store))
    assert draft is not None  # Config guarantees a draft section for drafter 'model'
    if draft.vocab_size != target.vocab_size:
        raise UsageError(Problem("draft.path", config.draft.path if config.draft else None,
                                 f"the draft's vocabulary ({draft.vocab_size}) differs from the target's "
                                 f"({target.vocab_size}); speculative sampling compares token ids",
                                 "pick a draft from the same model family (same tokenizer), or use drafter: ngram"))
    return ModelDrafter(draft)


def _load_torch(config: Config) -> tuple[ModelBackend, ModelBackend | None, PreTrainedTokenizerBase]:
    from neuron_ssp.backends.torch import TorchBackend, load_hf_model, resolve_device

    device = resolve_device(config.platform.device)
    target_dir = resolve_model_path(config.target.path, "target.path")
    draft_cfg = config.draft if config.speculation.drafter == "model" else None
    draft_dir = resolve_model_path(draft_cfg.path, "draft.path") if draft_cfg else None
    target_model = load_hf_model(target_dir, config.target.dtype, device)
    target = TorchBackend(target_model, config.target.n_positions, name="target")
    draft = None
    if draft_cfg is not None and draft_dir is not None:
        same = _same_model(target_dir, draft_dir, config.target, draft_cfg)
        draft_model = target_model if same else load_hf_model(draft_dir, draft_cfg.dtype, device)
        draft = TorchBackend(draft_model, draft_cfg.n_positions, name="draft")
    return target, draft, AutoTokenizer.from_pretrained(str(target_dir))


def _same_model(target_dir: Path, draft_dir: Path, target: ModelConfig, draft: ModelConfig) -> bool:
    """draft = target shares the weights (two caches, one model) instead of loading twice."""
    return target_dir.resolve() == draft_dir.resolve() and target.dtype == draft.dtype
