"""The engine for a config: our loop with its drafter, acceptor and policy, or a library's loop.

Backends are loaded once (pipeline.load); everything built here is cheap and shares them.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Protocol

import torch

from neuron_ssp.backends.base import ModelBackend
from neuron_ssp.config import Config
from neuron_ssp.drafters import Drafter, ModelDrafter, NgramDrafter, SuffixDrafter, SuffixHistory
from neuron_ssp.drafters.suffix_store import HistoryFile
from neuron_ssp.engines.native import GenerationResult, SpeculativeGenerator, sampling_params
from neuron_ssp.errors import Problem, UsageError
from neuron_ssp.speculation.acceptors import TokenAcceptor
from neuron_ssp.speculation.policies import build_draft_stop, build_policy


class Generator(Protocol):
    """What a pipeline drives: our SpeculativeGenerator or a library's engine."""

    def generate(self, prompt_ids: torch.Tensor, max_new_tokens: int, eos_token_ids: Collection[int] = (),
                 on_tokens: Callable[[list[int]], None] | None = None) -> GenerationResult: ...


def build_generator(config: Config, target: ModelBackend, draft: ModelBackend | None, acceptor: TokenAcceptor,
                    rng: torch.Generator) -> Generator:
    """Our loop by default; transformers-neuronx's own loop with `engine: library`, its on-device
    FusedSpeculativeDecoder with `engine: fused` (Neuron only)."""
    if config.speculation.engine == "library":
        from neuron_ssp.engines.library import LibraryEngine

        return LibraryEngine.from_config(config, target, draft, acceptor, rng)
    if config.speculation.engine == "fused":  # validate_config refused what the fused decoder cannot do
        from neuron_ssp.engines.fused import FusedEngine

        return FusedEngine.build(config, target, draft)
    return SpeculativeGenerator(target, build_drafter(config, target, draft, rng), acceptor,
                                build_policy(config.speculation, target), config.sampling, config.speculation.k, rng)


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
    from neuron_ssp.backends.torch.load import resolve_device

    return resolve_device(config.platform.device)
