"""Finding a tp degree at which models sharing the same cores fit in device memory.

transformers-neuronx puts draft and target of one process on the same cores with the same tp, so
one degree is searched for all of them together.
"""

from __future__ import annotations

from dataclasses import dataclass

from neuron_ssp.config import ModelConfig
from neuron_ssp.topology.catalog import Instance
from neuron_ssp.topology.memory import Footprint, footprint, usable_bytes_per_core
from neuron_ssp.topology.models import Architecture
from neuron_ssp.topology.parallelism import KV_PADDING, allowed_tp_degrees, runs_on, tp_tested


@dataclass(frozen=True)
class Placed:
    """A configured model with its resolved architecture, as the library version planned for lays it out."""

    model: ModelConfig
    architecture: Architecture
    library: str = "transformers-neuronx"  # neuron.library: how heads are sharded
    kv_rule: str = KV_PADDING  # transformers-neuronx's layout by version (parallelism.KV_RULES)
    windows: tuple[int, ...] = ()  # every k compiled into it (the target); () for a draft

    def footprint(self, tp_degree: int | None = None) -> Footprint:
        """Its device memory at `tp_degree` (default: the configured one)."""
        tp = self.model.tp_degree if tp_degree is None else tp_degree
        return footprint(
            self.architecture,
            self.model.dtype,
            tp,
            self.model.n_positions,
            self.model.batch_size,
            self.library,
            self.kv_rule,
            self.windows,
        )


def shared_bytes_per_core(models: list[Placed], tp_degree: int) -> int:
    """Device memory per core when every model uses the same `tp_degree` cores."""
    return sum(p.footprint(tp_degree).bytes_per_core for p in models)


def fitting_tp_degrees(models: list[Placed], instance: Instance) -> list[int]:
    """Every tp degree the instance accepts at which the models fit together, smallest first."""
    if not all(runs_on(p.library, instance.generation) for p in models):
        return []
    usable = usable_bytes_per_core(instance.hbm_per_core_bytes)
    return [
        tp
        for tp in allowed_tp_degrees(instance.generation, instance.neuron_cores)
        if shared_bytes_per_core(models, tp) <= usable
    ]


def recommended_tp(fitting: list[int], instance: Instance) -> int | None:
    """The largest tested degree that fits: decoding is bound by memory bandwidth, so more cores
    per model mean faster tokens (the AWS Machine Learning
    Blog post of 2024-08-05 puts both 70B and 7B on all 32 Trn1 cores)."""
    tested = [tp for tp in fitting if tp_tested(instance.generation, tp)]
    return max(tested or fitting, default=None)
