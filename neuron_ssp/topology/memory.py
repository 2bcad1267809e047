"""Device memory per NeuronCore: weights sharded by tp plus the KV cache, against HBM minus headroom.

A model that does not fit fails only at load time, after minutes of compiling; this arithmetic
says so up front and says which tp degree would fit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from neuron_ssp.topology.catalog import GIB
from neuron_ssp.topology.models import Architecture

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}

# Share of each core's HBM we keep free for what the weights and KV cache do not account for:
# the runtime's scratchpad, the compiled programs (one per context-length bucket and the
# speculation window), I/O and collective-communication buffers. DESIGN.md (from the seed blog)
# says keep 20-30 %; we take the middle, so a 16 GiB core offers 12 GiB to weights and KV cache.
HEADROOM_FRACTION = 0.25


@dataclass(frozen=True)
class Footprint:
    """Device memory of one model with a given dtype, tp degree, n_positions and batch size."""

    weight_bytes: int  # whole model
    kv_bytes: int  # whole model, kv heads counted once
    weight_bytes_per_core: int
    kv_bytes_per_core: int  # kv heads replicated when tp exceeds them

    @property
    def bytes_per_core(self) -> int:
        return self.weight_bytes_per_core + self.kv_bytes_per_core


def footprint(architecture: Architecture, dtype: str, tp_degree: int, n_positions: int,
              batch_size: int) -> Footprint:
    """Weights: params x bytes, split over tp. KV: 2 (k and v) x layers x kv heads x head dim x bytes
    per token; on Neuron each core holds ceil(kv_heads / tp) heads, so few kv heads get replicated."""
    width = DTYPE_BYTES[dtype]
    tokens = n_positions * batch_size
    weights = architecture.params * width
    kv_row = 2 * architecture.layers * architecture.head_dim * width * tokens
    return Footprint(
        weight_bytes=weights,
        kv_bytes=kv_row * architecture.kv_heads,
        weight_bytes_per_core=math.ceil(weights / tp_degree),
        kv_bytes_per_core=kv_row * math.ceil(architecture.kv_heads / tp_degree),
    )


def usable_bytes_per_core(hbm_per_core_bytes: int) -> int:
    """HBM a core offers to weights and KV cache once the headroom is set aside."""
    return int(hbm_per_core_bytes * (1 - HEADROOM_FRACTION))


def cores_needed(usage: Footprint, hbm_per_core_bytes: int) -> float:
    """How many cores' usable HBM the model fills (weights + unreplicated KV cache); a fraction
    means the next whole number of cores, rounded up to a tp degree the platform allows."""
    return (usage.weight_bytes + usage.kv_bytes) / usable_bytes_per_core(hbm_per_core_bytes)


def gib(n_bytes: int) -> float:
    """Bytes in GiB, the unit HBM per core is quoted in."""
    return n_bytes / GIB
