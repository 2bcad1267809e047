"""NeuronCore placement: which cores each model occupies, in which order they load, what is visible.

The Neuron runtime lets a second model use exactly the cores of a first one or cores disjoint from
them, never a partial overlap; transformers-neuronx places every model of a process from the first
visible core, and `NEURON_RT_VISIBLE_CORES` takes one contiguous range, set before the runtime starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from neuron_ssp.config import Config, ModelConfig
from neuron_ssp.topology.models import HeadModel

Relation = Literal["identical", "disjoint", "partial"]


@dataclass(frozen=True)
class CoreSet:
    """A contiguous run of NeuronCores: `first` .. `first + count - 1`."""

    first: int
    count: int

    @property
    def last(self) -> int:
        return self.first + self.count - 1

    def relation(self, other: CoreSet) -> Relation:
        if self == other:
            return "identical"
        if self.last < other.first or other.last < self.first:
            return "disjoint"
        return "partial"

    def __contains__(self, core: int) -> bool:
        return self.first <= core <= self.last

    def __str__(self) -> str:
        return str(self.first) if self.count == 1 else f"{self.first}-{self.last}"


def loaded_models(config: Config) -> dict[str, ModelConfig]:
    """The models a config puts on the device: the target, and the draft when it drafts (a draft model, or on
    Neuron an EAGLE head, which NxD Inference and vllm-neuron hold on the target's cores)."""
    models = {"target": config.target}
    drafter, draft = config.speculation.drafter, config.draft
    if drafter == "model" and draft is not None:
        models["draft"] = draft
    elif drafter in ("eagle", "eagle3") and draft is not None and config.platform.backend == "neuron":
        models["draft"] = HeadModel(**draft.model_dump(), target=config.target)
    return models


def core_set(model: ModelConfig) -> CoreSet:
    return CoreSet(model.first_core, model.tp_degree)


def load_order(core_sets: dict[str, CoreSet]) -> list[str]:
    """Lower cores first; on shared cores the target first. The target is the largest allocation
    and the likeliest not to fit, so it gets the unfragmented memory and fails before the draft
    has been loaded for nothing. (Same core set in either order loads; partial overlaps never do.)"""
    return sorted(core_sets, key=lambda role: (core_sets[role].first, role != "target"))


def visible_cores(core_sets: dict[str, CoreSet]) -> str:
    """The contiguous range for NEURON_RT_VISIBLE_CORES covering every model's cores."""
    first = min(cores.first for cores in core_sets.values())
    last = max(cores.last for cores in core_sets.values())
    return str(CoreSet(first, last - first + 1))


def busiest_core_bytes(core_sets: dict[str, CoreSet], bytes_per_core: dict[str, int]) -> int:
    """Device memory on the fullest core, adding up every model that occupies it. The sum only
    changes where a core set begins, so those cores are the only ones to look at."""
    return max(
        sum(bytes_per_core[role] for role, occupied in core_sets.items() if start.first in occupied)
        for start in core_sets.values()
    )
