"""plan_deployment: per-model memory, cores, load order, visible cores and cost on one instance.

The Neuron backend reads `load_order`, each model's `first_core` / `tp_degree` and `visible_cores`
from the plan; `neuron-ssp plan` prints it so a user sees the numbers before renting the machine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from neuron_ssp.config import Config, ModelConfig
from neuron_ssp.errors import Problem, UsageError
from neuron_ssp.topology.batch_plan import BatchMemory, batch_ladder, largest_fitting_batch, memory_per_batch
from neuron_ssp.topology.catalog import INSTANCES, Instance, find_instance, similar_instances
from neuron_ssp.topology.costs import cost_per_million_tokens, published_latency
from neuron_ssp.topology.fitting import Placed, fitting_tp_degrees, recommended_tp, shared_bytes_per_core
from neuron_ssp.topology.memory import (
    HEADROOM_FRACTION,
    NETWORK_BYTES_PER_CORE,
    Footprint,
    cores_needed,
    gib,
    usable_bytes_per_core,
)
from neuron_ssp.topology.models import Architecture, resolve_architecture
from neuron_ssp.topology.networks import Networks, compiled_networks, context_buckets, token_buckets
from neuron_ssp.topology.nxdi_graphs import nxdi_context_buckets, nxdi_graphs, nxdi_token_buckets
from neuron_ssp.topology.parallelism import KV_PADDING, KV_RULES, allowed_tp_degrees, device_heads, runs_on
from neuron_ssp.topology.placement import (
    CoreSet,
    busiest_core_bytes,
    core_set,
    load_order,
    loaded_models,
    visible_cores,
)


@dataclass(frozen=True)
class ModelPlan:
    """One model on the device: where it sits and what it occupies."""

    role: str
    path: str
    architecture: Architecture
    dtype: str
    tp_degree: int
    first_core: int
    n_positions: int
    batch_size: int
    footprint: Footprint
    cores_needed: float  # core-equivalents of usable HBM (weights + KV), before rounding to a tp
    smallest_fitting_tp: int | None  # on this instance, this model alone
    cores: CoreSet
    graphs: Networks  # compiled per model (NxDI: per target and k), one neuronx-cc run each
    context_buckets: list[int]  # prompt lengths with a context-encoding graph (a prompt runs the first above it)
    decoding_buckets: list[int]  # cache lengths with a decoding graph


@dataclass(frozen=True)
class DeploymentPlan:
    """Everything needed to place the models, and what the placement costs."""

    config_name: str
    kv_rule: str  # how the planned library version lays out kv heads (parallelism.KV_RULES)
    instance: Instance
    models: dict[str, ModelPlan]
    load_order: list[str]
    visible_cores: str  # for NEURON_RT_VISIBLE_CORES
    busiest_core_bytes: int  # device memory on the fullest core, all models on it together
    usable_bytes_per_core: int  # HBM per core minus HEADROOM_FRACTION
    fitting_tp_degrees: list[int]  # one tp for all models (in-process), at which they fit together
    recommended_tp: int | None
    ms_per_token: float | None
    ms_per_token_source: str
    refusal: str | None = None  # why no tp fits on this instance; None when one does
    library: str = "transformers-neuronx"  # neuron.library: whose head sharding the per-core figures follow
    per_batch: list[BatchMemory] = field(default_factory=list)  # the models at 1, 2, 4, ... the configured batch
    largest_fitting_batch: int = 0  # at the configured tp and cores (batch_plan.LARGEST_BATCH_SEARCHED at most)

    @property
    def headroom_fraction(self) -> float:
        return HEADROOM_FRACTION

    @property
    def within_instance(self) -> bool:
        """Every model's cores exist on the instance."""
        return all(m.cores.last < self.instance.neuron_cores for m in self.models.values())

    @property
    def fits(self) -> bool:
        return self.within_instance and self.busiest_core_bytes <= self.usable_bytes_per_core

    @property
    def cost_per_hour(self) -> float | None:
        return self.instance.price_per_hour

    @property
    def cost_per_million_tokens(self) -> float | None:
        if self.cost_per_hour is None or self.ms_per_token is None:
            return None
        return cost_per_million_tokens(self.cost_per_hour, self.ms_per_token)

    def to_dict(self) -> dict[str, Any]:
        """JSON form for `neuron-ssp plan --json`."""
        return {
            "config": self.config_name,
            "kv_rule": self.kv_rule,
            "kv_rule_source": KV_RULES[self.kv_rule],
            "network_bytes_per_core_assumed": NETWORK_BYTES_PER_CORE,
            "instance": asdict(self.instance),
            "models": {role: _model_dict(m) for role, m in self.models.items()},
            "load_order": self.load_order,
            "visible_cores": self.visible_cores,
            "busiest_core_bytes": self.busiest_core_bytes,
            "usable_bytes_per_core": self.usable_bytes_per_core,
            "headroom_fraction": self.headroom_fraction,
            "within_instance": self.within_instance,
            "fits": self.fits,
            "fitting_tp_degrees": self.fitting_tp_degrees,
            "recommended_tp": self.recommended_tp,
            "refusal": self.refusal,
            "library": self.library,
            "per_batch": [row.to_dict() for row in self.per_batch],
            "largest_fitting_batch": self.largest_fitting_batch,
            "cost_per_hour": self.cost_per_hour,
            "ms_per_token": self.ms_per_token,
            "ms_per_token_source": self.ms_per_token_source,
            "cost_per_million_tokens": self.cost_per_million_tokens,
        }


def plan_deployment(
    config: Config,
    instance_type: str | None = None,
    ms_per_token: float | None = None,
    kv_rule: str = KV_PADDING,
    windows: Sequence[int] | None = None,
    batches: Sequence[int] | None = None,
) -> DeploymentPlan:
    """The plan of `config` on `instance_type` (default: the config's), for the transformers-neuronx
    generation `kv_rule` and a target compiled for `windows` (default: speculation.k), with the memory at each of
    `batches` (default: 1, 2, 4, ... the target's batch_size). UsageError when there is no known instance or a
    model's architecture cannot be told. It plans what is asked even if it does not fit (`fits` says so);
    `validate_config` says what to change."""
    instance = _instance(instance_type or config.platform.instance_type)
    placed = place_models(
        loaded_models(config), config.neuron.library, kv_rule, tuple(windows or (config.speculation.k,))
    )
    plans = {role: _model_plan(config, role, p, instance) for role, p in placed.items()}
    sets = {role: core_set(p.model) for role, p in placed.items()}
    per_core = {role: plan.footprint.bytes_per_core for role, plan in plans.items()}
    fitting = fitting_tp_degrees(list(placed.values()), instance)
    usable = usable_bytes_per_core(instance.hbm_per_core_bytes)
    latency = published_latency(placed["target"].architecture.name, instance.name)
    if ms_per_token is not None:
        source = "given"
    elif latency is not None:
        ms_per_token = latency.ms_per_token
        source = f"published plain decoding of {placed['target'].architecture.name}: {latency.source}"
    else:
        source = "no published latency for this model and instance: pass --ms-per-token"
    return DeploymentPlan(
        config_name=config.name,
        kv_rule=kv_rule,
        instance=instance,
        models=plans,
        load_order=load_order(sets),
        visible_cores=visible_cores(sets),
        busiest_core_bytes=busiest_core_bytes(sets, per_core),
        usable_bytes_per_core=usable,
        fitting_tp_degrees=fitting,
        recommended_tp=recommended_tp(fitting, instance),
        ms_per_token=ms_per_token,
        ms_per_token_source=source,
        refusal=None if fitting else refusal(list(placed.values()), instance),
        library=config.neuron.library,
        per_batch=memory_per_batch(placed, usable, batches or batch_ladder(config.target.batch_size)),
        largest_fitting_batch=largest_fitting_batch(placed, usable),
    )


def refusal(models: list[Placed], instance: Instance) -> str:
    """Why no tp degree hosts `models` on `instance`: the library, the total memory, or the largest tp."""
    library = models[0].library
    if not runs_on(library, instance.generation):
        return (
            f"{library} does not support {instance.generation} (NxD Inference does: set neuron.library: nxdi, "
            "with a DLAMI of SDK 2.29 or later)"
        )
    need = sum(cores_needed(p.footprint(1), instance.hbm_per_core_bytes) for p in models)
    if need > instance.neuron_cores:
        return f"weights + KV cache fill {need:.1f} cores' usable HBM; it has {instance.neuron_cores} cores"
    tp = max(allowed_tp_degrees(instance.generation, instance.neuron_cores))
    usable = usable_bytes_per_core(instance.hbm_per_core_bytes)
    reason = (
        f"at tp {tp} (its largest) a core holds {gib(shared_bytes_per_core(models, tp)):.2f} GiB, "
        f"over the {gib(usable):.2f} GiB usable"
    )
    padded = [
        f"{p.architecture.name} heads {p.architecture.heads}/{p.architecture.kv_heads} -> {q}/{kv}"
        for p in models
        for q, kv in [device_heads(p.library, p.architecture.heads, p.architecture.kv_heads, tp, p.kv_rule)]
        if (q, kv) != (p.architecture.heads, p.architecture.kv_heads)
    ]
    return reason + (f" (padded and replicated, query/kv: {'; '.join(padded)})" if padded else "")


def plan_all_instances(
    config: Config, ms_per_token: float | None = None, kv_rule: str = KV_PADDING
) -> list[DeploymentPlan]:
    """The config on every catalog instance, each at its recommended tp for all models (first core
    0), or as configured where nothing fits, so `fits` and the costs compare across instances."""
    plans = []
    for instance in INSTANCES.values():
        as_configured = plan_deployment(config, instance.name, ms_per_token, kv_rule)
        tp = as_configured.recommended_tp
        if tp is not None:
            as_configured = plan_deployment(_with_tp(config, tp), instance.name, ms_per_token, kv_rule)
        plans.append(as_configured)
    return plans


def _instance(instance_type: str | None) -> Instance:
    if instance_type is None:
        raise UsageError(
            Problem(
                "platform.instance_type",
                None,
                "a plan needs an instance type",
                "pass --instance TYPE (e.g. trn1.32xlarge) or set platform.instance_type",
            )
        )
    instance = find_instance(instance_type)
    if instance is None:
        near = similar_instances(instance_type)
        hint = f"did you mean {' or '.join(near)}? " if near else ""
        raise UsageError(
            Problem(
                "platform.instance_type",
                instance_type,
                "not a known instance type",
                f"{hint}use one of {', '.join(INSTANCES)}",
            )
        )
    return instance


def place_models(
    models: dict[str, ModelConfig], library: str, kv_rule: str, windows: tuple[int, ...]
) -> dict[str, Placed]:
    """Each model with its architecture (UsageError naming every one that cannot be told), laid out as
    `library` (and transformers-neuronx's `kv_rule`) does; the target holds the speculation `windows`."""
    problems, placed = [], {}
    for role, model in models.items():
        try:
            placed[role] = Placed(
                model, resolve_architecture(model, role), library, kv_rule, windows if role == "target" else ()
            )
        except UsageError as exc:
            problems.extend(exc.problems)
    if problems:
        raise UsageError(problems)
    return placed


def _model_plan(config: Config, role: str, placed: Placed, instance: Instance) -> ModelPlan:
    model, architecture = placed.model, placed.architecture
    usage = placed.footprint()
    alone = fitting_tp_degrees([placed], instance)
    if placed.library == "nxdi":
        graphs = nxdi_graphs(config, role, model)
        buckets = (nxdi_context_buckets(config, model), nxdi_token_buckets(config, model))
    elif placed.library == "vllm-neuron":  # it compiles its own graphs at startup; a row reads its KV to its position
        graphs, buckets = Networks(0, 0, 0), ([], [model.n_positions])
    else:
        continuous = config.speculation.engine == "native" and model.batch_size > 1
        graphs = compiled_networks(model.n_positions, placed.windows, model.batch_size, continuous)
        buckets = (context_buckets(model.n_positions), token_buckets(model.n_positions))
    return ModelPlan(
        role=role,
        path=model.path,
        architecture=architecture,
        dtype=model.dtype,
        tp_degree=model.tp_degree,
        first_core=model.first_core,
        n_positions=model.n_positions,
        batch_size=model.batch_size,
        footprint=usage,
        cores_needed=cores_needed(usage, instance.hbm_per_core_bytes),
        smallest_fitting_tp=alone[0] if alone else None,
        cores=core_set(model),
        graphs=graphs,
        context_buckets=buckets[0],
        decoding_buckets=buckets[1],
    )


def _with_tp(config: Config, tp_degree: int) -> Config:
    moved = {"tp_degree": tp_degree, "first_core": 0}
    update: dict[str, Any] = {"target": config.target.model_copy(update=moved)}
    if config.draft is not None:
        update["draft"] = config.draft.model_copy(update=moved)
    return config.model_copy(update=update)


def _model_dict(plan: ModelPlan) -> dict[str, Any]:
    usage = plan.footprint
    return {
        "path": plan.path,
        "architecture": asdict(plan.architecture),
        "dtype": plan.dtype,
        "tp_degree": plan.tp_degree,
        "first_core": plan.first_core,
        "cores": str(plan.cores),
        "n_positions": plan.n_positions,
        "batch_size": plan.batch_size,
        "weight_bytes": usage.weight_bytes,
        "kv_bytes": usage.kv_bytes,
        "weight_bytes_per_core": usage.weight_bytes_per_core,
        "kv_bytes_per_core": usage.kv_bytes_per_core,
        "extra_networks": usage.extra_networks,
        "network_bytes_per_core": usage.network_bytes_per_core,
        "bytes_per_core": usage.bytes_per_core,
        "cores_needed": plan.cores_needed,
        "smallest_fitting_tp": plan.smallest_fitting_tp,
        "graphs": {**asdict(plan.graphs), "total": plan.graphs.total},
        "context_buckets": plan.context_buckets,
        "decoding_buckets": plan.decoding_buckets,
    }
