"""`plan --engine`: projected tokens per second per batch size, plain decoding and speculation, with what it assumes.

No hardware, no measurement at batch > 1 published for these pairs: the figures scale the published batch-1
latency (projection.py) by the bytes a decoding call reads. ASSUMED, and said beside the figures:
- a decoding call is memory-bound: its time is proportional to the bytes each core reads, the model's weights
  once for the whole batch plus every row's KV cache; the published batch-1 ms is that read for one row. Fixed
  costs (collectives, launches) are scaled with it, which overstates the cost of a larger batch;
- each row reads its KV cache over the decoding bucket that holds its position (a compiled graph attends over its
  whole bucket), averaged over a generation of max_new_tokens after a max_prompt_tokens prompt
  (batch_plan.mean_positions_read);
- a k-wide call costs what a one-token call of the same batch costs (the weights are read once either way), until
  the batch x k tokens of a call make it compute-bound: that knee is not modelled (bench-serve measures it);
- every row accepts at the same α, independently (τ = (1-α^k)/(1-α) per row and call);
- each batch size is a model compiled for it: with one compiled batch B, fewer running rows still pay B's call
  (rows are padded to it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from neuron_ssp.config import Config
from neuron_ssp.topology.batch_plan import mean_positions_read
from neuron_ssp.topology.fitting import Placed
from neuron_ssp.topology.memory import footprint
from neuron_ssp.topology.placement import loaded_models
from neuron_ssp.topology.plan import DeploymentPlan, place_models
from neuron_ssp.topology.projection import draft_steps, published_or_given, tokens_per_call

ASSUMPTIONS = (
    "a decoding call is memory-bound: ms proportional to the bytes a core reads, its weights once for all rows plus "
    "each row's KV cache; the published batch-1 ms is that read for one row (fixed costs scaled too: conservative)",
    "each row reads its KV cache over the decoding bucket holding its position, averaged over a generation",
    "a k-wide call costs a one-token call of the same batch, until batch x k tokens make it compute-bound (not "
    "modelled: measure with bench-serve)",
    "every row accepts at the same α; each batch size as compiled for it (fewer rows than compiled pay the full call)",
)


@dataclass(frozen=True)
class CallCost:
    """ms of one decoding call of a model at batch B, scaled from its published batch-1 ms by the bytes read."""

    ms_at_batch_1: float
    weight_bytes_per_core: int
    kv_bytes_per_row: float  # per core, at the mean positions read

    def ms(self, batch: int) -> float:
        one_row = self.weight_bytes_per_core + self.kv_bytes_per_row
        return self.ms_at_batch_1 * (self.weight_bytes_per_core + batch * self.kv_bytes_per_row) / one_row


def call_cost(placed: Placed, ms_at_batch_1: float, positions_read: float) -> CallCost:
    """The model's weights per core and one row's KV cache per core at `positions_read` positions."""
    model, architecture = placed.model, placed.architecture
    per_position = footprint(
        architecture, model.dtype, model.tp_degree, 1, 1, placed.library, placed.kv_rule
    ).kv_bytes_per_core
    weights = placed.footprint().weight_bytes_per_core
    return CallCost(ms_at_batch_1, weights, per_position * positions_read)


@dataclass(frozen=True)
class BatchThroughput:
    batch: int
    target_call_ms: float | None
    plain_tokens_per_s: float | None  # plain decoding of the target at this batch
    speculative_tokens_per_s: float | None

    @property
    def speedup(self) -> float | None:
        if self.plain_tokens_per_s is None or self.speculative_tokens_per_s is None:
            return None
        return self.speculative_tokens_per_s / self.plain_tokens_per_s


@dataclass(frozen=True)
class BatchProjection:
    engine: str
    k: int
    alpha: float
    rows: list[BatchThroughput]
    notes: list[str]  # where each latency and the positions read come from
    assumptions: tuple[str, ...] = ASSUMPTIONS

    def to_dict(self) -> dict[str, object]:
        return {
            "engine": self.engine,
            "k": self.k,
            "alpha": self.alpha,
            "notes": self.notes,
            "assumptions": list(self.assumptions),
            "rows": [{**row.__dict__, "speedup": row.speedup} for row in self.rows],
        }


def project_batches(
    engine: str,
    k: int,
    alpha: float,
    instance: str,
    target: Placed,
    draft: Placed | None,
    positions_read: dict[str, float],
    batches: Sequence[int],
    target_ms: float | None = None,
    draft_ms: float | None = None,
    draft_estimate: tuple[float, str] | None = None,
) -> BatchProjection:
    """Tokens per second of all rows together at each of `batches`; `draft` None: a model-free drafter (free);
    `draft_estimate`: (ms, what it assumes) of a draft with no published or given latency (an EAGLE head)."""
    target_ms, target_note = published_or_given(
        target.architecture.name, instance, target_ms, "--ms-per-token", "published plain decoding"
    )
    notes = [f"target: {target_note}"]
    draft_cost: CallCost | None = None
    if draft is not None:
        if draft_ms is None and draft_estimate is not None:
            draft_ms, draft_note = draft_estimate
        else:
            draft_ms, draft_note = published_or_given(
                draft.architecture.name, instance, draft_ms, "--draft-ms-per-token", "published"
            )
        notes.append(f"draft: {draft_note}")
        if draft_ms is not None:
            draft_cost = call_cost(draft, draft_ms, positions_read["draft"])
    notes.append(
        "KV positions read per row and call: "
        + ", ".join(f"{role} {positions:.0f}" for role, positions in positions_read.items())
    )
    target_cost = None if target_ms is None else call_cost(target, target_ms, positions_read["target"])
    tau, steps = tokens_per_call(alpha, k), draft_steps(engine, k)
    rows = []
    for batch in batches:
        target_call = None if target_cost is None else target_cost.ms(batch)
        plain = None if target_call is None else 1000.0 * batch / target_call
        draft_call = 0.0 if draft is None else (None if draft_cost is None else draft_cost.ms(batch))
        iteration = None if target_call is None or draft_call is None else target_call + steps * draft_call
        speculative = None if iteration is None else 1000.0 * batch * tau / iteration
        rows.append(BatchThroughput(batch, target_call, plain, speculative))
    return BatchProjection(engine, k, alpha, rows, notes)


def plan_batch_projection(
    config: Config,
    deployment: DeploymentPlan,
    engine: str,
    alpha: float,
    batches: Sequence[int],
    target_ms: float | None = None,
    draft_ms: float | None = None,
    draft_estimate: tuple[float, str] | None = None,
) -> BatchProjection:
    """`project_batches` for a config as planned: its models laid out as the plan lays them out, each row reading
    the KV positions of a generation of max_new_tokens after a max_prompt_tokens prompt (default: the longest prompt
    n_positions leaves room for) in the model's decoding buckets."""
    placed = place_models(loaded_models(config), deployment.library, deployment.kv_rule, (config.speculation.k,))
    new_tokens = config.generation.max_new_tokens
    positions = {}
    for role, p in placed.items():
        prompt = config.generation.max_prompt_tokens or max(p.model.n_positions - new_tokens, 0)
        positions[role] = mean_positions_read(prompt, new_tokens, deployment.models[role].decoding_buckets)
    return project_batches(
        engine,
        config.speculation.k,
        alpha,
        deployment.instance.name,
        placed["target"],
        placed.get("draft"),
        positions,
        batches,
        target_ms,
        draft_ms,
        draft_estimate,
    )
