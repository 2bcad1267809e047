"""The engine for a config: our loop with its drafter, acceptor and policy, or a library's loop.

Backends are loaded once (pipeline.load); everything built here is cheap and shares them. What every
request of a pipeline shares is in `Shared`: the target's call cost (timed once at load), the cost
policy's acceptance counts, and the drafter (a model-free drafter's history of earlier requests). Each
request runs with its own settings (`request_settings`): acceptor, policy and drafter state over those. With
per-position noise a window cannot change a seeded output, so sampled and greedy requests share the counts.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, cast

import torch

from neuron_ssp.backends.base import ModelBackend
from neuron_ssp.config import Config, SamplingConfig
from neuron_ssp.drafters import Drafter, ModelDrafter, NgramDrafter, SuffixDrafter, SuffixHistory
from neuron_ssp.drafters.base import PerRow
from neuron_ssp.drafters.combined import DraftChoice, LookupOrHead
from neuron_ssp.drafters.eagle import EagleDrafter, EagleModel, measure_head_ms
from neuron_ssp.drafters.eagle_checkpoint import read_checkpoint
from neuron_ssp.drafters.registry import drafter_kind
from neuron_ssp.drafters.suffix_store import HistoryFile
from neuron_ssp.embedded.heads import resolve_head_path
from neuron_ssp.engines.base import sampling_params
from neuron_ssp.engines.native import SpeculativeGenerator
from neuron_ssp.engines.prefix_pool import MB, default_budget_bytes
from neuron_ssp.engines.rows import Generator, ProcessorFor, RowSettings
from neuron_ssp.errors import Problem, UsageError
from neuron_ssp.speculation.acceptors import build_acceptor
from neuron_ssp.speculation.call_cost import TIMED_ROWS, WidthCost, target_cost
from neuron_ssp.speculation.controls import Grammar, RequestControls
from neuron_ssp.speculation.cost_policy import AcceptanceModel
from neuron_ssp.speculation.policies import WindowPolicy, build_draft_stop, build_policy

if TYPE_CHECKING:
    from neuron_ssp.backends.neuron.on_device import OnDeviceBackend
    from neuron_ssp.backends.neuron.scoring import NeuronBackend


@dataclass
class Shared:
    """What every request of a pipeline shares. `cost`: the target's call cost by rows and context, needed by the
    cost policy (None otherwise); `drafter`: the loaded drafter (None for the libraries' engines)."""

    cost: WidthCost | None = None
    drafter: Drafter | None = None
    acceptance: AcceptanceModel = field(default_factory=AcceptanceModel)


def share(
    config: Config,
    target: ModelBackend,
    draft: ModelBackend | None,
    max_rows: int | None = None,
    cost: WidthCost | None = None,
) -> Shared:
    """What the requests of `config` will share: the drafter, and for the cost policy the target's call cost,
    timed here (1-3 s on a CPU) unless `cost` (timed for another config of the same target) covers k.
    `max_rows`: the most rows a call will score (a batch: serve.max_batch x k), timed as well up to TIMED_ROWS."""
    spec = config.speculation
    if spec.engine != "native":
        return Shared()
    timed = drafter_kind(spec.drafter).drafts and (spec.policy == "cost" or spec.drafter == "ngram+eagle3")
    if timed and (cost is None or max(cost.ms) < max(spec.k, min(max_rows or 0, TIMED_ROWS))):
        cost = target_cost(target, spec.k, max_rows)
    drafter = build_drafter(config, target, draft, torch.Generator(device=sampling_device(config)), cost)
    return Shared(cost if spec.policy == "cost" and drafter is not None else None, drafter)


def build_generator(config: Config, target: ModelBackend, draft: ModelBackend | None, shared: Shared) -> Generator:
    """The engine for `config`: our loop by default; transformers-neuronx's own loop with `engine: library`, its
    on-device FusedSpeculativeDecoder with `engine: fused` (Neuron only), or NxD Inference's fused speculation with
    `engine: fused` and `neuron.library: nxdi`. Its own requests (`generate`) get the settings a request with the
    config's sampling gets (`request_settings`, also for a sampling set on it later); our loop drafts with
    `shared.drafter` (built with `build_drafter` where `shared` has none).
    """
    spec = config.speculation
    settings = request_settings(config, config.sampling, draft, shared)
    acceptor, policy, rng = settings.acceptor, settings.policy, settings.rng
    assert acceptor is not None and policy is not None and rng is not None  # request_settings sets all three
    if spec.engine == "library":  # pipeline.load loaded transformers-neuronx models for this engine
        from neuron_ssp.engines.library import LibraryEngine

        neuron_draft = cast("NeuronBackend | None", draft)
        return LibraryEngine.from_config(config, cast("NeuronBackend", target), neuron_draft, acceptor, rng)
    if spec.engine == "fused" and config.neuron.library == "nxdi":
        from neuron_ssp.engines.nxdi_fused import NxdiFusedEngine

        return NxdiFusedEngine(target, spec.k)
    if spec.engine == "fused":  # validate_config refused what the fused decoder cannot do
        from neuron_ssp.engines.fused import FusedEngine

        return FusedEngine.build(config, cast("OnDeviceBackend", target), cast("OnDeviceBackend", draft))
    if shared.drafter is None and drafter_kind(spec.drafter).drafts:
        shared = replace(shared, drafter=build_drafter(config, target, draft, rng))
    pool_bytes = prefix_pool_bytes(config, target)

    def settings_for(sampling: SamplingConfig) -> RowSettings:
        """`generate`'s requests are built as the pipeline builds the server's."""
        return request_settings(config, sampling, draft, shared)

    return SpeculativeGenerator(
        target, shared.drafter, acceptor, policy, config.sampling, spec.k, rng, shared.cost, pool_bytes, settings_for
    )


def prefix_pool_bytes(config: Config, target: ModelBackend) -> int | None:
    """Our loop's prefix caching (platform.prefix_cache): the pool's budget in bytes, 0 for warm slots alone; None
    when off. `true` on a backend that offers no blocks (the torch path: CUDA, no C compiler) is refused here, the
    first place that knows (topology/prefix_rules.py refuses what a config alone shows)."""
    platform = config.platform
    if platform.prefix_cache is False:
        return None
    if platform.prefix_cache and getattr(target, "prefix_blocks", None) is None:
        raise UsageError(
            Problem(
                "platform.prefix_cache",
                True,
                f"{target.name} offers no cache blocks to reuse: prefix caching needs the row kernel, whose rows do "
                "not depend on the call they are in (on CUDA or without a C compiler a hit could change an answer "
                "in its last bits)",
                "run on a CPU with a C compiler (cc), or leave platform.prefix_cache out",
            )
        )
    return default_budget_bytes() if platform.prefix_pool_mb is None else platform.prefix_pool_mb * MB


def request_settings(
    config: Config,
    sampling: SamplingConfig,
    draft: ModelBackend | None,
    shared: Shared,
    min_p: float = 0.0,
    processor_for: ProcessorFor | None = None,
) -> RowSettings:
    """How one request runs: `sampling`'s settings (and its controls' `min_p`) and seed, its own acceptor and window
    policy, a drafter per cache slot over the pipeline's shared models, cost, counts and drafter history, and its
    grammar and sampling controls (`processor_for`, pipeline/controls.py)."""
    params = replace(sampling_params(sampling), min_p=min_p)
    rng = torch.Generator(device=sampling_device(config))
    loaded = shared.drafter

    def drafter_for(slot: int) -> Drafter:
        """The row's drafter: its own over the shared models and history (drafters.base.PerRow), or the loaded
        one where it keeps no state per request (prompt lookup)."""
        assert loaded is not None  # drafter_for is handed out only with a loaded drafter
        return loaded.for_row(slot, params, rng) if isinstance(loaded, PerRow) else loaded

    return RowSettings(
        params,
        sampling.seed,
        drafter_for if loaded is not None else None,
        build_acceptor(config.speculation.acceptor, params, rng),
        row_policy(config, shared),
        rng,
        processor_for,
        config.speculation.grammar_forced_drafts,
    )


def row_policy(config: Config, shared: Shared) -> WindowPolicy:
    """The config's window policy over the shared counts; plain decoding (drafter none) opens no window, nor do
    the libraries' loops, whose windows are their own."""
    if not drafter_kind(config.speculation.drafter).drafts or config.speculation.engine != "native":
        return WindowPolicy(1)
    return build_policy(config.speculation, shared.cost, shared.acceptance)


def build_drafter(
    config: Config,
    target: ModelBackend,
    draft: ModelBackend | None,
    rng: torch.Generator,
    cost: WidthCost | None = None,
) -> Drafter | None:
    """None for drafter 'none': plain decoding. The EAGLE drafters read the head `draft.path` names and tell the
    target which layers to tap; ngram+eagle3 weighs its choice with the target's `cost` (timed if not given)."""
    spec = config.speculation
    if not drafter_kind(spec.drafter).drafts:
        return None
    if spec.drafter == "ngram":
        return NgramDrafter(target.vocab_size, spec.ngram_max, spec.ngram_min)
    if spec.drafter in ("eagle3", "ngram+eagle3"):
        assert config.draft is not None  # Config guarantees a draft section for the EAGLE drafters
        model = EagleModel(read_checkpoint(resolve_head_path(config.draft.path)), target)
        head = EagleDrafter(model, 0, sampling_params(config.sampling), rng, build_draft_stop(spec))
        if spec.drafter == "eagle3":
            return head
        choice = DraftChoice(cost or target_cost(target, spec.k), measure_head_ms(model))
        return LookupOrHead(NgramDrafter(target.vocab_size, spec.ngram_max, spec.ngram_min), head, choice)
    if spec.drafter == "suffix":
        persist = spec.suffix.persist_path
        store = HistoryFile(persist, config.target.path, target.vocab_size) if persist else None
        return SuffixDrafter(target.vocab_size, spec.suffix, SuffixHistory(spec.suffix, store))
    assert draft is not None  # Config guarantees a draft section for drafter 'model'
    if draft.vocab_size != target.vocab_size:
        raise UsageError(
            Problem(
                "draft.path",
                config.draft.path if config.draft else None,
                f"the draft's vocabulary ({draft.vocab_size}) differs from the target's "
                f"({target.vocab_size}); speculative sampling compares token ids",
                "pick a draft from the same model family (same tokenizer), or use drafter: ngram",
            )
        )
    return ModelDrafter(draft, sampling_params(config.sampling), rng, build_draft_stop(spec))


def refuse_unhonoured(config: Config, sampling: SamplingConfig) -> None:
    """A UsageError for what a request's sampling asks that the engine cannot do per request (fused: sampling
    is compiled into the on-device graph, and its random generator cannot be seeded per request)."""
    if config.speculation.engine != "fused":
        return
    loaded = config.sampling
    fields = ["temperature", "top_k", "top_p"] + (["seed"] if loaded.temperature > 0 else [])
    problems = [
        Problem(
            name,
            getattr(sampling, name),
            f"engine fused samples on the device with the settings it "
            f"was compiled with ({name} {getattr(loaded, name)}); it cannot change them per request",
            f"leave {name} out (the server's value is used), or serve with speculation.engine: native",
        )
        for name in fields
        if getattr(sampling, name) != getattr(loaded, name)
    ]
    if problems:
        raise UsageError(problems)


def engine_controls_problems(config: Config, controls: RequestControls) -> list[Problem]:
    """What the engine cannot run of a request's controls (`controls_refusal`), each naming the request's field."""
    why = controls_refusal(config)
    if why is None or not controls.asked:
        return []
    engine = config.speculation.engine
    return [
        Problem(
            name if name != "grammar" or controls.grammar is None else controls.grammar.field,
            _shown(getattr(controls, name)),
            f"engine {engine} cannot apply it: {why}, so no row's logits can be changed before its token is chosen",
            f"leave {name} out, or serve with speculation.engine: native (our loop samples on the host, on Neuron too)",
        )
        for name in controls.asked
    ]


def controls_refusal(config: Config) -> str | None:
    """Why the engine refuses every grammar and sampling control, or None (engine native). Only our loop samples on
    the host, where a row's logits can be processed; transformers-neuronx's loops (library: its
    SpeculativeGenerator.sample draws the draft's and the target's tokens itself; fused: on the device) and NxD
    Inference's fused graph (on-device sampling) never show us a row's logits before its token is chosen."""
    engine = config.speculation.engine
    if engine == "native":
        return None
    if engine == "fused" and config.neuron.library == "nxdi":
        return "NxD Inference's fused speculation samples on the device"
    if engine == "fused":
        return "transformers-neuronx's fused decoder samples on the device"
    return "transformers-neuronx's own loop (SpeculativeGenerator.sample) draws the tokens itself"


def _shown(value: object) -> object:
    """A control's value as a message shows it (a grammar by its kind)."""
    return value.kind if isinstance(value, Grammar) else value


def sampling_device(config: Config) -> torch.device:
    """The torch backend keeps logits on its device (CUDA or CPU); Neuron returns them on the host."""
    if config.platform.backend != "torch":
        return torch.device("cpu")
    from neuron_ssp.backends.torch.load import resolve_device

    return resolve_device(config.platform.device)
