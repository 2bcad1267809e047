"""Rules that need Neuron hardware facts: instance, tp degree, core placement, batch and memory.

Each breach found here would otherwise surface as a compile error or a load failure on an
instance billed by the hour.
"""

from __future__ import annotations

from neuron_ssp.config import ModelConfig
from neuron_ssp.errors import Problem
from neuron_ssp.topology.catalog import INSTANCES, Instance, find_instance, similar_instances
from neuron_ssp.topology.fitting import Placed, fitting_tp_degrees
from neuron_ssp.topology.memory import HEADROOM_FRACTION, footprint, gib, usable_bytes_per_core
from neuron_ssp.topology.models import Architecture
from neuron_ssp.topology.parallelism import (
    TESTED_TP,
    TP_RULE,
    nearest_allowed,
    padded_heads,
    tp_allowed,
    tp_tested,
)
from neuron_ssp.topology.placement import busiest_core_bytes, core_set
from neuron_ssp.topology.report import ValidationReport

SUPPORTED = ", ".join(name for name, i in INSTANCES.items() if i.generation != "trn2")


def check_instance(instance_type: str | None, report: ValidationReport,
                   library: str = "transformers-neuronx") -> Instance | None:
    """The instance the hardware rules use; None (and an error) when there is no usable one for `library`."""
    field = "platform.instance_type"
    if instance_type is None:
        report.errors.append(Problem(field, None, "required with platform.backend 'neuron'",
                                     "set it to the instance you deploy on, e.g. trn1.32xlarge"))
        return None
    instance = find_instance(instance_type)
    if instance is None:
        near = similar_instances(instance_type)
        hint = f"did you mean {' or '.join(near)}? " if near else ""
        known = ", ".join(INSTANCES) if library == "nxdi" else SUPPORTED
        report.errors.append(Problem(field, instance_type, "not a known Neuron instance type",
                                     f"{hint}use one of {known}"))
        return None
    if library == "nxdi":
        if instance.generation != "trn2":
            report.warnings.append(Problem(
                "neuron.library", library,
                f"NxD Inference runs Llama on {instance.generation} up to Neuron SDK 2.28 (NxDI 0.8); from SDK 2.29 "
                "its models are supported on Trn2 and newer only (NxDI release notes, 2.29.0)",
                "use the NxD Inference venv of a Neuron SDK 2.28 DLAMI on this instance, or deploy on trn2.48xlarge"))
        return instance
    if instance.generation == "trn2":
        report.errors.append(Problem(
            field, instance_type,
            "trn2 is not supported by transformers-neuronx (its last release line, SDK 2.25, "
            "targets Trn1 and Inf2)",
            "set neuron.library: nxdi (NxD Inference supports speculative decoding on trn2), or deploy on "
            "trn1.32xlarge or inf2.48xlarge"))
        return None
    return instance


def check_tp(role: str, model: ModelConfig, architecture: Architecture | None, instance: Instance,
             report: ValidationReport) -> None:
    """tp allowed by the platform and within its cores; if so, warn off the tested set or when
    heads get padded."""
    tp, field, generation = model.tp_degree, f"{role}.tp_degree", instance.generation
    if tp > instance.neuron_cores:
        report.errors.append(Problem(
            field, tp, f"exceeds the {instance.neuron_cores} NeuronCores of {instance.name}",
            f"use at most {instance.neuron_cores}, or a larger instance"))
        return
    if not tp_allowed(generation, tp):
        options = " or ".join(str(t) for t in nearest_allowed(generation, tp, instance.neuron_cores))
        report.errors.append(Problem(field, tp, TP_RULE[generation], f"use {options}"))
        return
    if not tp_tested(generation, tp):
        tested = ", ".join(str(t) for t in TESTED_TP[generation])
        report.warnings.append(Problem(
            field, tp, f"allowed on {generation} but outside the degrees AWS tested ({tested})",
            "prefer a tested degree unless you have checked this one"))
    if architecture is not None and architecture.heads % tp:
        report.warnings.append(Problem(
            field, tp,
            f"{architecture.name} has {architecture.heads} attention heads, not divisible by {tp}: "
            f"they are padded to {padded_heads(architecture.heads, tp)}, costing time and memory "
            "(`neuron-ssp plan` counts it per core)",
            "use a tp_degree that divides the head count, if one fits"))


def check_batch(models: dict[str, ModelConfig], report: ValidationReport) -> None:
    """Speculation on Neuron runs one sequence at a time in this package."""
    for role, model in models.items():
        if model.batch_size != 1:
            report.errors.append(Problem(
                f"{role}.batch_size", model.batch_size,
                "must be 1: speculative sampling on Neuron runs one sequence per call here",
                f"set {role}.batch_size to 1 and run several processes for throughput"))


def check_placement(models: dict[str, ModelConfig], instance: Instance, report: ValidationReport,
                    library: str = "transformers-neuronx") -> None:
    """Core sets inside the instance; with transformers-neuronx the draft on exactly the target's cores
    (in-process loading). NxD Inference loads each model on its own ranks (`load(dir, start_rank_id,
    local_ranks_size)`) and its own demo gives the draft a tp of its own (inference_demo.py:520,
    `--draft-model-tp-degree`), so there only the bounds apply (engine fused: engine_rules).
    Runs after check_tp and check_memory, so its fix can tell whether the target's tp is sound."""
    for role, model in models.items():
        cores = core_set(model)
        if model.tp_degree <= instance.neuron_cores < cores.last + 1:
            report.errors.append(Problem(
                f"{role}.first_core", model.first_core,
                f"cores {cores} run past the {instance.neuron_cores} NeuronCores of {instance.name} "
                f"(0-{instance.neuron_cores - 1})",
                f"set {role}.first_core to at most {instance.neuron_cores - model.tp_degree}"))
    if "draft" not in models or library == "nxdi":
        return
    target, draft = models["target"], models["draft"]
    target_cores, draft_cores = core_set(target), core_set(draft)
    relation = draft_cores.relation(target_cores)
    if draft.tp_degree != target.tp_degree:
        report.errors.append(Problem(
            "draft.tp_degree", draft.tp_degree,
            f"draft cores {draft_cores} vs target cores {target_cores}: transformers-neuronx loads "
            "draft and target of one process onto the same cores, so their tp_degree must match "
            "(a different one fails to load, as the AWS Neuron Samples notebook speculative_sampling.ipynb "
            "warns)",
            _same_tp_fix(target.tp_degree, report)))
    if draft.first_core != target.first_core:
        why = ("the runtime never accepts a partial overlap of core sets" if relation == "partial"
               else "disjoint sets would need a second process, which this backend does not start")
        report.errors.append(Problem(
            "draft.first_core", draft.first_core,
            f"draft cores {draft_cores} and target cores {target_cores} differ: transformers-neuronx "
            f"places every model of a process from the first visible core, and {why}",
            f"set the draft's first_core to {target.first_core}, like the target"))


def _same_tp_fix(target_tp: int, report: ValidationReport) -> str:
    """Point at the target's tp unless that one is itself reported wrong (run after check_tp/memory)."""
    if any(p.field == "target.tp_degree" for p in report.errors):
        return "give the draft the same tp_degree as the target, once the target's is fixed (see target.tp_degree)"
    return f"set the draft's tp_degree to {target_tp}, like the target"


def check_memory(placed: dict[str, Placed], instance: Instance, report: ValidationReport) -> None:
    """Weights/tp + KV cache of every model on a core must fit its HBM minus the headroom."""
    usable = usable_bytes_per_core(instance.hbm_per_core_bytes)
    per_core = {
        role: footprint(p.architecture, p.model.dtype, p.model.tp_degree, p.model.n_positions,
                        p.model.batch_size, p.library).bytes_per_core
        for role, p in placed.items()
    }
    limit = (f"more than the {gib(usable):.2f} GiB usable of {instance.hbm_per_core_gib} GiB HBM "
             f"per core ({HEADROOM_FRACTION:.0%} kept as headroom)")
    models = list(placed.values())
    for role, p in placed.items():
        if per_core[role] > usable:
            report.errors.append(Problem(
                f"{role}.tp_degree", p.model.tp_degree,
                f"{p.architecture.name} in {p.model.dtype} needs {gib(per_core[role]):.2f} GiB per core "
                f"at tp_degree {p.model.tp_degree}, {limit}", _memory_fix(models, instance)))
    if any(per_core[role] > usable for role in placed):
        return
    sets = {role: core_set(p.model) for role, p in placed.items()}
    busiest = busiest_core_bytes(sets, per_core)
    if busiest > usable:
        report.errors.append(Problem(
            "target.tp_degree", placed["target"].model.tp_degree,
            f"target and draft share cores and need {gib(busiest):.2f} GiB on a core together, {limit}",
            _memory_fix(models, instance)))


def _memory_fix(models: list[Placed], instance: Instance) -> str:
    fitting = fitting_tp_degrees(models, instance)
    roles = "target and draft" if len(models) > 1 else "the target"
    if fitting:
        return (f"set tp_degree to {fitting[0]} for {roles} (the smallest degree {instance.name} "
                "accepts at which they fit), or lower n_positions")
    return (f"nothing fits on {instance.name} at any tp_degree: use a larger instance "
            "(see `neuron-ssp plan CONFIG --all-instances`), bf16 instead of fp32, or a smaller n_positions")
