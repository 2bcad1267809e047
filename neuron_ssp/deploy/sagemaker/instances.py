"""SageMaker instance types (ml.*) mapped to the topology catalog, and their hosting prices.

SageMaker bills hosting at its own rates, higher than EC2 on-demand for the same machine, so the
EC2 prices of the catalog are not reused here.
"""

from __future__ import annotations

from dataclasses import dataclass

from neuron_ssp.errors import Problem, UsageError
from neuron_ssp.topology.catalog import Instance, find_instance, similar_instances

ML_PREFIX = "ml."

# Real-time inference on demand, us-east-1, USD per instance-hour. Not re-checked from this machine
# (no network): taken from a public table of SageMaker list prices read on 2026-09-27. Other
# regions differ; check https://aws.amazon.com/sagemaker/pricing/ before relying on it.
HOSTING_PRICE_SOURCE = (
    "SageMaker real-time inference, us-east-1 on demand, list price as of 2026-09-27 (not re-checked: "
    "aws.amazon.com/sagemaker/pricing)"
)
HOSTING_USD_PER_HOUR: dict[str, float] = {
    "ml.inf2.xlarge": 0.99,
    "ml.inf2.8xlarge": 2.36,
    "ml.inf2.24xlarge": 7.79,
    "ml.inf2.48xlarge": 15.58,
    "ml.trn1.2xlarge": 1.54,
    "ml.trn1.32xlarge": 24.73,
}
# ml.* types SageMaker hosts (botocore's ProductionVariantInstanceType) that transformers-neuronx runs on.
HOSTED_NEURON_TYPES = (
    "ml.inf2.xlarge",
    "ml.inf2.8xlarge",
    "ml.inf2.24xlarge",
    "ml.inf2.48xlarge",
    "ml.trn1.2xlarge",
    "ml.trn1.32xlarge",
    "ml.trn1n.32xlarge",
)


@dataclass(frozen=True)
class HostingPrice:
    usd_per_hour: float | None
    source: str

    def amount(self, instances: int = 1) -> str:
        return "unknown" if self.usd_per_hour is None else f"${self.usd_per_hour * instances:,.2f}/h"

    def text(self, instances: int = 1) -> str:
        return f"{self.amount(instances)} ({self.source})"


def ml_type(instance_type: str) -> str:
    """inf2.48xlarge -> ml.inf2.48xlarge."""
    return instance_type if instance_type.startswith(ML_PREFIX) else ML_PREFIX + instance_type


def catalog_instance(ml_instance_type: str, field: str = "--instance-type") -> Instance:
    """ml.inf2.48xlarge -> the catalog's inf2.48xlarge, or a Problem naming the types SageMaker hosts."""
    if not ml_instance_type.startswith(ML_PREFIX):
        raise UsageError(
            Problem(
                field, ml_instance_type, "SageMaker instance types start with 'ml.'", f"use {ml_type(ml_instance_type)}"
            )
        )
    if ml_instance_type not in HOSTED_NEURON_TYPES:
        close = similar_instances(ml_instance_type[len(ML_PREFIX) :])
        hint = f" (did you mean {', '.join(ml_type(c) for c in close)}?)" if close else ""
        raise UsageError(
            Problem(
                field,
                ml_instance_type,
                "not a SageMaker-hosted instance type that runs transformers-neuronx" + hint,
                f"use one of {', '.join(HOSTED_NEURON_TYPES)}",
            )
        )
    instance = find_instance(ml_instance_type[len(ML_PREFIX) :])
    assert instance is not None, ml_instance_type  # every hosted type is in the catalog
    return instance


def hosting_price(ml_instance_type: str) -> HostingPrice:
    price = HOSTING_USD_PER_HOUR.get(ml_instance_type)
    if price is None:
        return HostingPrice(None, "no SageMaker price recorded; see https://aws.amazon.com/sagemaker/pricing/")
    return HostingPrice(price, HOSTING_PRICE_SOURCE)
