"""What compiling a config costs on the host: networks, parallel neuronx-cc processes, memory and time.

`to_neuron()` loads a model's weights on the host and then compiles all its networks at once
(base.py `compile`: `ProcessPoolExecutor(parallel_degree)`, default one process per network; lines
45-54 at 7a30b42, 55-64 at 1ade6d7). `compile --k 2..8` gives a 70B target with n_positions 2048 45
networks, so 45 neuronx-cc processes beside the checkpoint in host memory. From 1ade6d7 on,
`NeuronConfig(compilation_worker_count=...)` bounds them (config.py line 239, base.py line 88); before,
`compile(parallel_degree=...)` does. The bound comes from the host's free memory.

Estimates with their basis, never measurements: the host memory of one neuronx-cc process and its time
per network are assumptions (below) until measured on the instance; the compile prints the real time.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from neuron_ssp.topology.catalog import GIB
from neuron_ssp.topology.fitting import Placed
from neuron_ssp.topology.memory import DTYPE_BYTES
from neuron_ssp.topology.networks import Networks, compiled_networks

# ASSUMED, not measured here: peak host memory of one neuronx-cc process compiling one network of a
# large Llama, and its time. Measure on the instance (`/usr/bin/time -v` on one compile, or the time
# `neuron-ssp compile` prints) and pass --compile-process-gib.
PROCESS_BYTES = 16 * GIB
MINUTES_PER_NETWORK = 5.0
HOST_RESERVE_FRACTION = 0.10  # of the free memory, left to the compiling process itself and the page cache


@dataclass(frozen=True)
class ModelCompile:
    role: str
    networks: Networks
    weights_on_host_bytes: int  # the checkpoint in the compile dtype, held while neuronx-cc runs


@dataclass(frozen=True)
class CompileEstimate:
    models: list[ModelCompile]  # compiled one after another, in load order
    workers: int  # neuronx-cc processes at once (per model)
    process_bytes: int
    host_available_bytes: int | None  # None: unknown, the library's default (one process per network) stays
    bounded: bool  # workers is below the largest model's network count

    @property
    def bound(self) -> int | None:
        """The workers to give the library; None where its default (one per network) is within bounds."""
        return self.workers if self.bounded else None

    @property
    def networks(self) -> int:
        return sum(m.networks.total for m in self.models)

    @property
    def peak_host_bytes(self) -> int:
        return max(
            (m.weights_on_host_bytes + min(self.workers, m.networks.total) * self.process_bytes for m in self.models),
            default=0,
        )

    @property
    def minutes(self) -> float:
        return sum(math.ceil(m.networks.total / self.workers) * MINUTES_PER_NETWORK for m in self.models)

    def lines(self) -> list[str]:
        """The estimate in words, each figure beside its basis."""
        per_model = "; ".join(
            f"{m.role}: {m.networks.total} ({m.networks.token} token, {m.networks.context} context, "
            f"{m.networks.speculation} speculation{_rows(m.networks)})"
            for m in self.models
        )
        available = (
            "unknown" if self.host_available_bytes is None else f"{self.host_available_bytes / GIB:.0f} GiB available"
        )
        return [
            f"networks to compile: {per_model} (transformers-neuronx bucket rules, topology/networks.py)",
            f"neuronx-cc processes at once: {self.workers} ({'bounded by host memory: ' if self.bounded else ''}"
            f"{available}, {HOST_RESERVE_FRACTION:.0%} of it kept free, {self.process_bytes / GIB:.0f} GiB per "
            "process assumed, the checkpoint held beside them)",
            f"estimated peak host memory: {self.peak_host_bytes / GIB:.0f} GiB (checkpoint in the compile dtype + "
            "processes x the assumed size)",
            f"estimated time: {self.minutes:.0f} min ({MINUTES_PER_NETWORK:g} min per network per process assumed, "
            "not measured; the compile prints the real time)",
        ]

    def to_dict(self) -> dict[str, object]:
        return {
            "networks": {m.role: m.networks.__dict__ for m in self.models},
            "workers": self.workers,
            "bounded": self.bounded,
            "host_available_bytes": self.host_available_bytes,
            "process_bytes_assumed": self.process_bytes,
            "peak_host_bytes_estimated": self.peak_host_bytes,
            "minutes_estimated": self.minutes,
            "minutes_per_network_assumed": MINUTES_PER_NETWORK,
        }


def _rows(networks: Networks) -> str:
    return f", each for batch {networks.batch}" if networks.batch > 1 else ""


def estimate_compile(
    placed: Mapping[str, Placed], host_available_bytes: int | None, process_bytes: int = PROCESS_BYTES
) -> CompileEstimate:
    """Networks per model and how many neuronx-cc processes fit beside the largest checkpoint."""
    models = [
        ModelCompile(
            role,
            compiled_networks(p.model.n_positions, p.windows, p.model.batch_size),
            p.architecture.params * DTYPE_BYTES[p.model.dtype],
        )
        for role, p in placed.items()
    ]
    most = max((m.networks.total for m in models), default=1)
    if host_available_bytes is None:
        return CompileEstimate(models, most, process_bytes, None, False)
    usable = int(host_available_bytes * (1 - HOST_RESERVE_FRACTION))
    spare = usable - max((m.weights_on_host_bytes for m in models), default=0)
    workers = max(1, min(most, spare // process_bytes))
    return CompileEstimate(models, workers, process_bytes, host_available_bytes, workers < most)
