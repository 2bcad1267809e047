"""The engine for a config: our loop with its drafter, acceptor and policy, or a library's loop.

Backends are loaded once (pipeline.load); everything built here is cheap and shares them.
`build_generator` is the one factory for "rng + acceptor + generator": the loader, the server's
per-request sampling, bench and tune-k all build through it. A pipeline's drafter is built once and
shared by the generators derived from it, so the suffix drafter's history (what it learnt from earlier
requests) survives a request that brings its own temperature or seed; greedy requests also share the
cost policy's acceptance counts (`Pipeline._generator_for` says why sampled ones do not).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Protocol

import torch

from neuron_ssp.backends.base import ModelBackend
from neuron_ssp.config import Config, SamplingConfig
from neuron_ssp.drafters import Drafter, ModelDrafter, NgramDrafter, SuffixDrafter, SuffixHistory
from neuron_ssp.drafters.suffix_store import HistoryFile
from neuron_ssp.engines.native import GenerationResult, SpeculativeGenerator, sampling_params
from neuron_ssp.errors import Problem, UsageError
from neuron_ssp.speculation.acceptors import build_acceptor
from neuron_ssp.speculation.cost_policy import AcceptanceModel
from neuron_ssp.speculation.policies import build_draft_stop, build_policy


class Generator(Protocol):
    """What a pipeline drives: our SpeculativeGenerator or a library's engine."""

    def generate(self, prompt_ids: torch.Tensor, max_new_tokens: int, eos_token_ids: Collection[int] = (),
                 on_tokens: Callable[[list[int]], None] | None = None) -> GenerationResult: ...


def build_generator(config: Config, target: ModelBackend, draft: ModelBackend | None,
                    drafter: Drafter | None = None, acceptance: AcceptanceModel | None = None) -> Generator:
    """rng + acceptor + generator for `config`: our loop by default; transformers-neuronx's own loop
    with `engine: library`, its on-device FusedSpeculativeDecoder with `engine: fused` (Neuron only), or
    NxD Inference's fused speculation with `engine: fused` and `neuron.library: nxdi`.

    The rng draws where the logits are (CUDA: no copies). `drafter`: an already built one to share (its
    history included); it follows `config.sampling` (a draft model samples with the request's settings).
    `acceptance`: the cost policy's acceptance counts to keep learning into (see `Pipeline`).
    """
    spec = config.speculation
    rng = torch.Generator(device=sampling_device(config))
    acceptor = build_acceptor(spec.acceptor, sampling_params(config.sampling), rng)
    if spec.engine == "library":
        from neuron_ssp.engines.library import LibraryEngine

        return LibraryEngine.from_config(config, target, draft, acceptor, rng)
    if spec.engine == "fused" and config.neuron.library == "nxdi":
        from neuron_ssp.engines.nxdi_fused import NxdiFusedEngine

        return NxdiFusedEngine(target, spec.k)
    if spec.engine == "fused":  # validate_config refused what the fused decoder cannot do
        from neuron_ssp.engines.fused import FusedEngine

        return FusedEngine.build(config, target, draft)
    drafter = share_drafter(drafter, config, rng) if drafter is not None else build_drafter(config, target, draft, rng)
    policy = build_policy(spec, target, acceptance)
    return SpeculativeGenerator(target, drafter, acceptor, policy, config.sampling, spec.k, rng)


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


def share_drafter(drafter: Drafter, config: Config, rng: torch.Generator) -> Drafter:
    """The same drafter for another generator: model-free drafters as they are (one history for all); a
    draft model drafts with this generator's sampling and rng (rejection sampling needs the q it drew from)."""
    if isinstance(drafter, ModelDrafter):
        return ModelDrafter(drafter.backend, sampling_params(config.sampling), rng, drafter.stop_below)
    return drafter


def refuse_unhonoured(config: Config, sampling: SamplingConfig) -> None:
    """A UsageError for what a request's sampling asks that the engine cannot do per request (fused: sampling
    is compiled into the on-device graph, and its random generator cannot be seeded per request)."""
    if config.speculation.engine != "fused":
        return
    loaded = config.sampling
    fields = ["temperature", "top_k", "top_p"] + (["seed"] if loaded.temperature > 0 else [])
    problems = [Problem(name, getattr(sampling, name), f"engine fused samples on the device with the settings it "
                        f"was compiled with ({name} {getattr(loaded, name)}); it cannot change them per request",
                        f"leave {name} out (the server's value is used), or serve with speculation.engine: native")
                for name in fields if getattr(sampling, name) != getattr(loaded, name)]
    if problems:
        raise UsageError(problems)


def sampling_device(config: Config) -> torch.device:
    """The torch backend keeps logits on its device (CUDA or CPU); Neuron returns them on the host."""
    if config.platform.backend != "torch":
        return torch.device("cpu")
    from neuron_ssp.backends.torch.load import resolve_device

    return resolve_device(config.platform.device)
