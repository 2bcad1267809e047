"""Device memory per batch size: the KV cache holds a row per sequence, so it grows with the batch while the
weights stay. `plan` prints it for 1, 2, 4, ... up to the configured batch and names the largest batch that fits.

Per core, a model at batch B holds its weights / tp plus B x the KV cache of one sequence of n_positions
(memory.footprint: 2 (k and v) x layers x kv heads on the core x head dim x bytes x n_positions x B). Draft and
target run the same batch (batch_rules), so both grow together.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from neuron_ssp.topology.fitting import Placed
from neuron_ssp.topology.placement import busiest_core_bytes, core_set

LARGEST_BATCH_SEARCHED = 256  # serve.max_batch's bound (config.py)


def batch_ladder(configured: int) -> list[int]:
    """1, 2, 4, ... below `configured`, then `configured`: the sizes a plan compares."""
    sizes, size = [], 1
    while size < configured:
        sizes.append(size)
        size *= 2
    return [*sizes, configured]


def at_batch(placed: Placed, batch: int) -> Placed:
    """The same model compiled for `batch` sequences."""
    return replace(placed, model=placed.model.model_copy(update={"batch_size": batch}))


@dataclass(frozen=True)
class BatchMemory:
    """Device memory of every model at one batch size, on the fullest core."""

    batch: int
    kv_bytes_per_core: dict[str, int]
    bytes_per_core: dict[str, int]  # weights + KV cache + extra networks
    busiest_core_bytes: int
    fits: bool

    def to_dict(self) -> dict[str, object]:
        return dict(self.__dict__)


def memory_at(placed: Mapping[str, Placed], batch: int, usable_bytes_per_core: int) -> BatchMemory:
    usages = {role: at_batch(p, batch).footprint() for role, p in placed.items()}
    per_core = {role: usage.bytes_per_core for role, usage in usages.items()}
    busiest = busiest_core_bytes({role: core_set(p.model) for role, p in placed.items()}, per_core)
    return BatchMemory(
        batch,
        {role: usage.kv_bytes_per_core for role, usage in usages.items()},
        per_core,
        busiest,
        busiest <= usable_bytes_per_core,
    )


def memory_per_batch(
    placed: Mapping[str, Placed], usable_bytes_per_core: int, batches: Sequence[int]
) -> list[BatchMemory]:
    return [memory_at(placed, batch, usable_bytes_per_core) for batch in batches]


def largest_fitting_batch(placed: Mapping[str, Placed], usable_bytes_per_core: int) -> int:
    """The largest batch (up to LARGEST_BATCH_SEARCHED) whose models fit at their configured tp; 0 if none."""
    fitting = 0
    for batch in range(1, LARGEST_BATCH_SEARCHED + 1):
        if not memory_at(placed, batch, usable_bytes_per_core).fits:
            break
        fitting = batch
    return fitting


def mean_positions_read(prompt_tokens: int, new_tokens: int, buckets: Sequence[int]) -> float:
    """KV positions a decoding call reads per row, averaged over a generation: the call that writes position p
    runs the smallest decoding bucket holding p + 1 slots, and a compiled graph attends over its whole bucket."""
    largest = buckets[-1]
    first = min(prompt_tokens, largest - 1)
    last = min(prompt_tokens + new_tokens, largest)
    slots = range(first + 1, last + 1)
    return sum(next(b for b in buckets if b >= slot) for slot in slots) / len(slots)
