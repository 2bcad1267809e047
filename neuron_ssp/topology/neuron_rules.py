"""Rules that need Neuron hardware facts: instance, tp degree, core placement and memory (batch: batch_rules.py).

Each breach found here would otherwise surface as a compile error or a load failure on an
instance billed by the hour.
"""

from __future__ import annotations

from neuron_ssp.config import ModelConfig
from neuron_ssp.errors import Problem
from neuron_ssp.topology.catalog import INSTANCES, Instance, find_instance, similar_instances
from neuron_ssp.topology.fitting import Placed, fitting_tp_degrees
from neuron_ssp.topology.memory import HEADROOM_FRACTION, gib, usable_bytes_per_core
from neuron_ssp.topology.models import Architecture
from neuron_ssp.topology.nxdi_releases import install_advice, release_for
from neuron_ssp.topology.parallelism import (
    KV_REPLICATED_TO_HEADS,
    TESTED_TP,
    TP_RULE,
    heads_on_device,
    nearest_allowed,
    padded_heads,
    tp_allowed,
    tp_tested,
)
from neuron_ssp.topology.placement import busiest_core_bytes, core_set
from neuron_ssp.topology.report import ValidationReport
from neuron_ssp.topology.vllm_neuron import VLLM_NEURON

SUPPORTED = ", ".join(name for name, i in INSTANCES.items() if i.generation != "trn2")


def check_instance(
    instance_type: str | None, report: ValidationReport, library: str = "transformers-neuronx"
) -> Instance | None:
    """The instance the hardware rules use; None (and an error) when there is no usable one for `library`."""
    field = "platform.instance_type"
    if instance_type is None:
        report.errors.append(
            Problem(
                field,
                None,
                "required with platform.backend 'neuron'",
                "set it to the instance you deploy on, e.g. trn1.32xlarge",
            )
        )
        return None
    instance = find_instance(instance_type)
    if instance is None:
        near = similar_instances(instance_type)
        hint = f"did you mean {' or '.join(near)}? " if near else ""
        known = ", ".join(INSTANCES) if library != "transformers-neuronx" else SUPPORTED
        report.errors.append(
            Problem(field, instance_type, "not a known Neuron instance type", f"{hint}use one of {known}")
        )
        return None
    if library == "vllm-neuron":
        if instance.generation != "trn2":
            report.errors.append(
                Problem(
                    field,
                    instance_type,
                    f"vllm-neuron runs on trn2 and trn3 only (Neuron SDK {VLLM_NEURON.sdk}: {VLLM_NEURON.platforms})",
                    "deploy on trn2.48xlarge, or use neuron.library: nxdi (trn1/inf2 up to SDK 2.28)",
                )
            )
            return None
        return instance
    if library == "nxdi":
        release = release_for(instance.generation)
        if release != release_for("trn2"):  # a family held back on an older SDK than the newest NxDI's
            report.warnings.append(
                Problem(
                    "neuron.library",
                    library,
                    f"NxD Inference runs Llama on {instance.generation} up to Neuron SDK {release.sdk} (NxDI "
                    f"{release.nxdi}); from SDK 2.29 its models are supported on Trn2 and newer only (NxDI release "
                    "notes, 2.29.0), so an unpinned install cannot run here",
                    f"install that release ({install_advice(instance.generation)}), or deploy on trn2.48xlarge",
                )
            )
        return instance
    if instance.generation == "trn2":
        report.errors.append(
            Problem(
                field,
                instance_type,
                "trn2 is not supported by transformers-neuronx (its last release line, SDK 2.25, "
                "targets Trn1 and Inf2)",
                "set neuron.library: nxdi (NxD Inference supports speculative decoding on trn2), or deploy on "
                "trn1.32xlarge or inf2.48xlarge",
            )
        )
        return None
    return instance


def check_tp(
    role: str, model: ModelConfig, architecture: Architecture | None, instance: Instance, report: ValidationReport
) -> None:
    """tp allowed by the platform and within its cores; if so, warn off the tested set or when
    heads get padded."""
    tp, field, generation = model.tp_degree, f"{role}.tp_degree", instance.generation
    if tp > instance.neuron_cores:
        report.errors.append(
            Problem(
                field,
                tp,
                f"exceeds the {instance.neuron_cores} NeuronCores of {instance.name}",
                f"use at most {instance.neuron_cores}, or a larger instance",
            )
        )
        return
    if not tp_allowed(generation, tp):
        options = " or ".join(str(t) for t in nearest_allowed(generation, tp, instance.neuron_cores))
        report.errors.append(Problem(field, tp, TP_RULE[generation], f"use {options}"))
        return
    if not tp_tested(generation, tp):
        tested = ", ".join(str(t) for t in TESTED_TP[generation])
        report.warnings.append(
            Problem(
                field,
                tp,
                f"allowed on {generation} but outside the degrees AWS tested ({tested})",
                "prefer a tested degree unless you have checked this one",
            )
        )
    if architecture is not None and architecture.heads % tp:
        report.warnings.append(
            Problem(
                field,
                tp,
                f"{architecture.name} has {architecture.heads} attention heads, not divisible by {tp}: "
                f"they are padded to {padded_heads(architecture.heads, tp)}, costing time and memory "
                "(`neuron-ssp plan` counts it per core)",
                "use a tp_degree that divides the head count, if one fits",
            )
        )


def check_placement(
    models: dict[str, ModelConfig], instance: Instance, report: ValidationReport, library: str = "transformers-neuronx"
) -> None:
    """Core sets inside the instance; with transformers-neuronx the draft on exactly the target's cores
    (in-process loading). NxD Inference too loads every model of a process from the first visible core, but
    its own demo gives the draft a tp of its own (inference_demo.py:520, `--draft-model-tp-degree`, both
    loaded with the default start_rank_id 0, :571, :585), so there the draft need only start where the target
    does. Runs after check_tp and check_memory, so its fix can tell whether the target's tp is sound."""
    for role, model in models.items():
        cores = core_set(model)
        if model.tp_degree <= instance.neuron_cores < cores.last + 1:
            report.errors.append(
                Problem(
                    f"{role}.first_core",
                    model.first_core,
                    f"cores {cores} run past the {instance.neuron_cores} NeuronCores of {instance.name} "
                    f"(0-{instance.neuron_cores - 1})",
                    f"set {role}.first_core to at most {instance.neuron_cores - model.tp_degree}",
                )
            )
    if "draft" not in models:
        return
    if library in ("nxdi", "vllm-neuron"):  # vllm-neuron: the head on the target's TP group (topology/vllm_neuron.py)
        _check_nxdi_placement(models["target"], models["draft"], report)
        return
    target, draft = models["target"], models["draft"]
    target_cores, draft_cores = core_set(target), core_set(draft)
    relation = draft_cores.relation(target_cores)
    if draft.tp_degree != target.tp_degree:
        report.errors.append(
            Problem(
                "draft.tp_degree",
                draft.tp_degree,
                f"draft cores {draft_cores} vs target cores {target_cores}: transformers-neuronx loads "
                "draft and target of one process onto the same cores, so their tp_degree must match "
                "(a different one fails to load, as the AWS Neuron Samples notebook speculative_sampling.ipynb "
                "warns)",
                _same_tp_fix(target.tp_degree, report),
            )
        )
    if draft.first_core != target.first_core:
        why = (
            "the runtime never accepts a partial overlap of core sets"
            if relation == "partial"
            else "disjoint sets would need a second process, which this backend does not start"
        )
        report.errors.append(
            Problem(
                "draft.first_core",
                draft.first_core,
                f"draft cores {draft_cores} and target cores {target_cores} differ: transformers-neuronx "
                f"places every model of a process from the first visible core, and {why}",
                f"set the draft's first_core to {target.first_core}, like the target",
            )
        )


def _check_nxdi_placement(target: ModelConfig, draft: ModelConfig, report: ValidationReport) -> None:
    """NxDI places a model by NEURON_RT_VISIBLE_CORES, one range per process, ranks 0.. from its first core:
    `load(dir, start_rank_id, ...)` offsets tensor-parallel ranks for multi-node runs (inference_demo.py:795),
    and the weights are sharded from neuron_config.start_rank_id (application_base.py:156-163), so a draft
    that starts on another core than the target cannot be placed there by one process."""
    if draft.first_core == target.first_core:
        return
    report.errors.append(
        Problem(
            "draft.first_core",
            draft.first_core,
            f"draft cores {core_set(draft)} vs target cores {core_set(target)}: NxD Inference loads every model of a "
            "process from the first visible core (NEURON_RT_VISIBLE_CORES); its start_rank_id is a multi-node rank "
            f"offset, so a draft at tp {draft.tp_degree} from core {draft.first_core} would be given ranks "
            f"{draft.first_core - target.first_core}.. of a {draft.tp_degree}-rank model, not other cores",
            f"set draft.first_core: {target.first_core} (the draft then runs on the target's first "
            f"{draft.tp_degree} cores, as NxDI's own demo loads it)",
        )
    )


def _same_tp_fix(target_tp: int, report: ValidationReport) -> str:
    """Point at the target's tp unless that one is itself reported wrong (run after check_tp/memory)."""
    if any(p.field == "target.tp_degree" for p in report.errors):
        return "give the draft the same tp_degree as the target, once the target's is fixed (see target.tp_degree)"
    return f"set the draft's tp_degree to {target_tp}, like the target"


def check_memory(placed: dict[str, Placed], instance: Instance, report: ValidationReport) -> None:
    """Weights/tp + KV cache of every model on a core must fit its HBM minus the headroom."""
    usable = usable_bytes_per_core(instance.hbm_per_core_bytes)
    per_core = {role: p.footprint().bytes_per_core for role, p in placed.items()}
    limit = (
        f"more than the {gib(usable):.2f} GiB usable of {instance.hbm_per_core_gib} GiB HBM "
        f"per core ({HEADROOM_FRACTION:.0%} kept as headroom)"
    )
    models = list(placed.values())
    for role, p in placed.items():
        if per_core[role] > usable:
            report.errors.append(
                Problem(
                    f"{role}.tp_degree",
                    p.model.tp_degree,
                    f"{p.architecture.name} in {p.model.dtype} needs {gib(per_core[role]):.2f} GiB per core "
                    f"at tp_degree {p.model.tp_degree}{_layout(p)}, {limit}",
                    _memory_fix(models, instance),
                )
            )
    if any(per_core[role] > usable for role in placed):
        return
    sets = {role: core_set(p.model) for role, p in placed.items()}
    busiest = busiest_core_bytes(sets, per_core)
    if busiest > usable:
        report.errors.append(
            Problem(
                "target.tp_degree",
                placed["target"].model.tp_degree,
                f"target and draft share cores and need {gib(busiest):.2f} GiB on a core together"
                f"{''.join(f'; {role}{_layout(p)}' for role, p in placed.items() if _layout(p))}, {limit}",
                _memory_fix(models, instance),
            )
        )


def _layout(p: Placed) -> str:
    """What the planned library version and compiled windows add, when they add anything."""
    usage = p.footprint()
    notes = []
    if (
        p.kv_rule == KV_REPLICATED_TO_HEADS
        and usage.kv_heads_on_device
        > heads_on_device(p.architecture.heads, p.architecture.kv_heads, p.model.tp_degree)[1]
    ):
        notes.append(
            f"its {p.architecture.kv_heads} kv heads replicated to {usage.kv_heads_on_device} by "
            "transformers-neuronx 0.10"
        )
    if usage.extra_networks:
        notes.append(
            f"{usage.extra_networks} more speculation networks for k in {list(p.windows)} "
            f"({gib(usage.network_bytes_per_core):.2f} GiB, assumed)"
        )
    return f" ({'; '.join(notes)})" if notes else ""


def _memory_fix(models: list[Placed], instance: Instance) -> str:
    fitting = fitting_tp_degrees(models, instance)
    roles = "target and draft" if len(models) > 1 else "the target"
    newer = (
        ", or install transformers-neuronx 0.11+ (SDK 2.19+), which replicates kv heads only up to tp"
        if any(p.kv_rule == KV_REPLICATED_TO_HEADS for p in models)
        else ""
    )
    fewer = ", or compile fewer k at once" if any(p.footprint().extra_networks for p in models) else ""
    if fitting:
        return (
            f"set tp_degree to {fitting[0]} for {roles} (the smallest degree {instance.name} "
            f"accepts at which they fit), or lower n_positions{newer}{fewer}"
        )
    return (
        f"nothing fits on {instance.name} at any tp_degree: use a larger instance "
        "(see `neuron-ssp plan CONFIG --all-instances`), bf16 instead of fp32, or a smaller n_positions"
        f"{newer}{fewer}"
    )
