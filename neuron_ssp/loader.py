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
from transformers import AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import logging as transformers_logging

from neuron_ssp.acceptors import TokenAcceptor, build_acceptor
from neuron_ssp.backends.base import ModelBackend
from neuron_ssp.config import EMBEDDED_PREFIX, Config, ModelConfig, SamplingConfig
from neuron_ssp.drafters import Drafter, ModelDrafter, NgramDrafter, SuffixDrafter, SuffixHistory
from neuron_ssp.drafters.suffix_store import HistoryFile
from neuron_ssp.embedded import check_embedded_answer, resolve_model_path
from neuron_ssp.errors import Problem, UsageError
from neuron_ssp.generator import (
    CommitCallback,
    GenerationResult,
    SpeculativeGenerator,
    StopCheck,
    check_room,
    plain_generate,
    sampling_params,
)
from neuron_ssp.policies import build_draft_stop, build_policy
from neuron_ssp.prompts import encode_messages, encode_prompt, stop_token_ids
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

    def encode(self, prompt: str, chat_template: bool | None = None) -> torch.Tensor:
        """The prompt's ids; `chat_template` None follows the config (False: raw text, as /v1/completions)."""
        use_template = self.config.generation.chat_template if chat_template is None else chat_template
        return encode_prompt(self.tokenizer, prompt, use_template)

    def encode_messages(self, messages: list[dict[str, str]]) -> torch.Tensor:
        """A conversation through the chat template; one user turn encodes exactly as `encode`."""
        return encode_messages(self.tokenizer, messages, self.config.generation.chat_template)

    @property
    def extra_slots(self) -> int:
        """Cache slots an engine writes past our loop's last one: transformers-neuronx's SpeculativeGenerator
        up to k more, the fused decoder k-1 more (see neuron_ssp.positions)."""
        spec = self.config.speculation
        return {"library": spec.k, "fused": spec.k - 1}.get(spec.engine, 0)

    def check_room(self, prompt_ids: torch.Tensor, max_new_tokens: int) -> None:
        """The n_positions rule `generate` enforces, asked before a request is queued."""
        check_room(self.target, prompt_ids.shape[0], max_new_tokens, "target.n_positions", self.extra_slots)

    def generate_ids(self, prompt_ids: torch.Tensor, max_new_tokens: int, sampling: SamplingConfig | None = None,
                     on_commit: CommitCallback | None = None, should_stop: StopCheck | None = None
                     ) -> GenerationResult:
        """One request with its own sampling settings (the server's entry point).

        `on_commit(tokens, from_draft, drafted)` reports each step's tokens, how many of them are
        accepted draft tokens and how many were drafted; `should_stop()` is asked once per iteration
        and cancels the generation. The library engine runs transformers-neuronx's loop in one call:
        its tokens arrive together at the end with origin unknown (`from_draft` None), and a cancel
        takes effect only after it returns.
        """
        generator = self._generator_for(sampling or self.config.sampling)
        if isinstance(generator, SpeculativeGenerator):
            return generator.generate(prompt_ids, max_new_tokens, self.eos_token_ids,
                                      on_commit=on_commit, should_stop=should_stop)
        on_tokens = (lambda tokens: on_commit(tokens, None, 0)) if on_commit else None
        return generator.generate(prompt_ids, max_new_tokens, self.eos_token_ids, on_tokens)

    def _generator_for(self, sampling: SamplingConfig) -> Generator:
        """The loaded generator for the config's sampling; a fresh one sharing the models otherwise."""
        if sampling == self.config.sampling:
            return self.generator
        config = self.config.model_copy(update={"sampling": sampling})
        rng = torch.Generator()
        acceptor = build_acceptor(config.speculation.acceptor, sampling_params(sampling), rng)
        return build_generator(config, self.target, self.draft, acceptor, rng)

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
    rng = torch.Generator(device=sampling_device(config))  # draws where the logits are (CUDA: no copies)
    acceptor = build_acceptor(config.speculation.acceptor, sampling_params(config.sampling), rng)  # fail fast
    transformers_logging.disable_progress_bar()
    if config.platform.backend == "neuron":
        from neuron_ssp.backends.neuron.load import load_neuron_backends
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
    """Our loop by default; transformers-neuronx's own loop with `engine: library`, its on-device
    FusedSpeculativeDecoder with `engine: fused` (Neuron only)."""
    if config.speculation.engine == "library":
        from neuron_ssp.backends.neuron.library import LibraryEngine

        return LibraryEngine.from_config(config, target, draft, acceptor, rng)
    if config.speculation.engine == "fused":  # validate_config refused what the fused decoder cannot do
        from neuron_ssp.backends.neuron.fused import FusedEngine

        return FusedEngine.build(config, target, draft)
    return SpeculativeGenerator(target, build_drafter(config, target, draft, rng), acceptor,
                                build_policy(config.speculation), config.sampling, config.speculation.k, rng)


def build_drafter(config: Config, target: ModelBackend, draft: ModelBackend | None,
                  rng: torch.Generator) -> Drafter:
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
    return ModelDrafter(draft, sampling_params(config.sampling), rng, build_draft_stop(spec))


def sampling_device(config: Config) -> torch.device:
    """The torch backend keeps logits on its device (CUDA or CPU); Neuron returns them on the host."""
    if config.platform.backend != "torch":
        return torch.device("cpu")
    from neuron_ssp.backends.torch import resolve_device

    return resolve_device(config.platform.device)


def _load_torch(config: Config) -> tuple[ModelBackend, ModelBackend | None, PreTrainedTokenizerBase]:
    from neuron_ssp.backends.torch import TorchBackend, load_hf_model, resolve_device

    device = resolve_device(config.platform.device)
    target_dir = resolve_model_path(config.target.path, "target.path")
    draft_cfg = config.draft if config.speculation.drafter == "model" else None
    draft_dir = resolve_model_path(draft_cfg.path, "draft.path") if draft_cfg else None
    tokenizer = AutoTokenizer.from_pretrained(str(target_dir))
    target_model = load_hf_model(target_dir, config.target.dtype, device)
    _check_if_embedded(target_model, tokenizer, config.target.path, "target.path")
    target = TorchBackend(target_model, config.target.n_positions, name="target")
    draft = None
    if draft_cfg is not None and draft_dir is not None:
        same = _same_model(target_dir, draft_dir, config.target, draft_cfg)
        draft_model = target_model if same else load_hf_model(draft_dir, draft_cfg.dtype, device)
        if not same:
            _check_if_embedded(draft_model, tokenizer, draft_cfg.path, "draft.path")
        draft = TorchBackend(draft_model, draft_cfg.n_positions, name="draft")
    return target, draft, tokenizer


def _check_if_embedded(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, path: str, field: str) -> None:
    """The embedded model's known answer costs one forward pass: cheap enough for every load."""
    if path.startswith(EMBEDDED_PREFIX):
        check_embedded_answer(model, tokenizer, path, field)


def _same_model(target_dir: Path, draft_dir: Path, target: ModelConfig, draft: ModelConfig) -> bool:
    """draft = target shares the weights (two caches, one model) instead of loading twice."""
    return target_dir.resolve() == draft_dir.resolve() and target.dtype == draft.dtype
