"""The EC2 instances with Neuron devices: cores, device memory, host and price.

Hardware rules (tp degree, placement, memory) are checked against these numbers before anything
loads, because a wrong guess costs a compile and a load on a machine billed by the hour.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Literal

Generation = Literal["inf2", "trn1", "trn2"]

GIB = 1024**3

# Where the prices come from: two from the AWS Neuron docs (2023); the others are the public
# on-demand Linux prices in us-east-1 from the AWS price list. trn2 has no on-demand price here.
PRICE_FROM_NEURON_DOCS = "AWS Neuron docs (2023), us-east-1 on-demand"
PRICE_FROM_AWS_LIST = "AWS public price list (us-east-1 on-demand, Linux)"


@dataclass(frozen=True)
class Instance:
    """One instance type as the Neuron runtime sees it."""

    name: str
    generation: Generation
    chips: int
    neuron_cores: int  # trn2: logical cores at the default LNC=2
    hbm_per_core_gib: int
    vcpus: int
    host_memory_gib: int
    price_per_hour: float | None  # USD
    price_source: str

    @property
    def cores_text(self) -> str:
        """'32 NeuronCores', or on trn2 '64 logical NeuronCores (LNC=2)': two physical cores per logical one."""
        return (
            f"{self.neuron_cores} logical NeuronCores (LNC=2)"
            if self.generation == "trn2"
            else f"{self.neuron_cores} NeuronCores"
        )

    @property
    def hbm_per_core_bytes(self) -> int:
        return self.hbm_per_core_gib * GIB


INSTANCES: dict[str, Instance] = {
    i.name: i
    for i in (
        Instance("inf2.xlarge", "inf2", 1, 2, 16, 4, 16, 0.7582, PRICE_FROM_AWS_LIST),
        Instance("inf2.8xlarge", "inf2", 1, 2, 16, 32, 128, 1.9679, PRICE_FROM_AWS_LIST),
        Instance("inf2.24xlarge", "inf2", 6, 12, 16, 96, 384, 6.4906, PRICE_FROM_AWS_LIST),
        Instance("inf2.48xlarge", "inf2", 12, 24, 16, 192, 768, 12.98, PRICE_FROM_NEURON_DOCS),
        Instance("trn1.2xlarge", "trn1", 1, 2, 16, 8, 32, 1.3438, PRICE_FROM_AWS_LIST),
        Instance("trn1.32xlarge", "trn1", 16, 32, 16, 128, 512, 21.50, PRICE_FROM_NEURON_DOCS),
        Instance("trn1n.32xlarge", "trn1", 16, 32, 16, 128, 512, 24.78, PRICE_FROM_AWS_LIST),
        Instance("trn2.48xlarge", "trn2", 16, 64, 24, 192, 2048, None, "no on-demand price recorded"),
    )
}


def find_instance(name: str) -> Instance | None:
    """The catalog entry for `name` (case-insensitive), or None."""
    return INSTANCES.get(name.strip().lower())


def similar_instances(name: str) -> list[str]:
    """Catalog names close to a misspelt one, for the fix text."""
    return difflib.get_close_matches(name.strip().lower(), list(INSTANCES), n=2, cutoff=0.6)


def hourly_price_usd(instance_type: str) -> float | None:
    """On-demand USD per hour of a catalog instance (us-east-1), None when unknown."""
    instance = find_instance(instance_type)
    return instance.price_per_hour if instance is not None else None
