"""Device memory per NeuronCore: weights sharded by tp plus the KV cache, against HBM minus headroom.

A model that does not fit fails only at load time, after minutes of compiling; this arithmetic
says so up front and says which tp degree would fit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from neuron_ssp.topology.catalog import GIB
from neuron_ssp.topology.models import Architecture
from neuron_ssp.topology.networks import token_buckets
from neuron_ssp.topology.parallelism import KV_PADDING, device_heads

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}

# Share of each core's HBM we keep free for what the weights and KV cache do not account for:
# the runtime's scratchpad, the compiled programs (one per context-length bucket and the
# speculation window), I/O and collective-communication buffers. The AWS Machine Learning Blog post
# of 2024-08-05 says keep 20-30 %; we take the middle, so a 16 GiB core offers 12 GiB to weights and KV cache.
HEADROOM_FRACTION = 0.25

# ASSUMED, not measured here: device memory one more compiled network takes on each core (its code, DMA
# rings and I/O buffers; weights and KV cache are shared by all networks of a model). The headroom covers
# the networks of a model compiled for one window k; every further k (`compile --k 2..8`) adds one network
# per token bucket (topology.networks), charged at this size. Replace it with neuron-top's figure.
NETWORK_BYTES_PER_CORE = 64 * 2**20


@dataclass(frozen=True)
class Footprint:
    """Device memory of one model with a given dtype, tp degree, n_positions and batch size."""

    weight_bytes: int  # whole model, as in the checkpoint
    kv_bytes: int  # whole model, kv heads counted once
    weight_bytes_per_core: int  # padded query heads and replicated kv heads included
    kv_bytes_per_core: int  # kv heads replicated when tp exceeds them
    q_heads_on_device: int  # query heads after padding to a multiple of tp
    kv_heads_on_device: int  # key/value heads after replication and padding, all cores together
    extra_networks: int = 0  # speculation networks beyond one window's, each NETWORK_BYTES_PER_CORE per core

    @property
    def network_bytes_per_core(self) -> int:
        return self.extra_networks * NETWORK_BYTES_PER_CORE

    @property
    def bytes_per_core(self) -> int:
        return self.weight_bytes_per_core + self.kv_bytes_per_core + self.network_bytes_per_core


def footprint(
    architecture: Architecture,
    dtype: str,
    tp_degree: int,
    n_positions: int,
    batch_size: int,
    library: str = "transformers-neuronx",
    kv_rule: str = KV_PADDING,
    windows: Sequence[int] = (),
) -> Footprint:
    """Weights: params x bytes, split over tp, plus the attention weights that padding and replication
    add (`device_heads`: each library's rule, and transformers-neuronx's `kv_rule` by version): 70B's 64
    heads become 72 at tp 12 or 24. KV: 2 (k and v) x layers x kv heads x head dim x bytes per token,
    each core holding its share of the kv heads on device. `windows`: every k compiled into one
    transformers-neuronx model, whose networks beyond the first k's are counted too (NxD Inference
    compiles one k per target)."""
    width = DTYPE_BYTES[dtype]
    tokens = n_positions * batch_size
    q_heads, kv_heads = device_heads(library, architecture.heads, architecture.kv_heads, tp_degree, kv_rule)
    added_heads = 2 * (q_heads - architecture.heads) + 2 * (kv_heads - architecture.kv_heads)  # q, o; k, v
    added_params = architecture.layers * architecture.hidden * architecture.head_dim * added_heads
    weights = architecture.params * width
    kv_row = 2 * architecture.layers * architecture.head_dim * width * tokens
    return Footprint(
        weight_bytes=weights,
        kv_bytes=kv_row * architecture.kv_heads,
        weight_bytes_per_core=math.ceil((architecture.params + added_params) * width / tp_degree),
        kv_bytes_per_core=kv_row * math.ceil(kv_heads / tp_degree),
        q_heads_on_device=q_heads,
        kv_heads_on_device=kv_heads,
        extra_networks=0 if library == "nxdi" else len(token_buckets(n_positions)) * max(len(set(windows)) - 1, 0),
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
