"""SageMaker instance types (ml.*) mapped to the topology catalog, their storage and hosting prices.

SageMaker bills hosting at its own rates, higher than EC2 on-demand for the same machine, so the
EC2 prices of the catalog are not reused here.

Storage: SageMaker copies the model prefix onto the instance. trn1/trn1n carry local NVMe instance
store (EC2: trn1.2xlarge 1 x 474 GB, trn1.32xlarge and trn1n.32xlarge 4 x 1900 GB), where the copy goes,
encrypted by the instance's hardware; inf2 has none, so the copy goes to an EBS volume whose default
is too small for a 70B pair. SageMaker's guidance for large models ("SageMaker AI endpoint parameters
for large model inference"): on an instance without a local disk, a model over 30 GB needs the
variant's `VolumeSizeInGB` set slightly larger than the model (botocore: 1 to 512).
"""

from __future__ import annotations

import math
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
# ml.* Neuron types SageMaker hosts (botocore 1.44.8's ProductionVariantInstanceType); which library runs on which
# is the topology rules' call (ml.trn2.48xlarge: NxD Inference and vllm-neuron, not transformers-neuronx).
HOSTED_NEURON_TYPES = (
    "ml.inf2.xlarge",
    "ml.inf2.8xlarge",
    "ml.inf2.24xlarge",
    "ml.inf2.48xlarge",
    "ml.trn1.2xlarge",
    "ml.trn1.32xlarge",
    "ml.trn1n.32xlarge",
    "ml.trn2.48xlarge",
)


# trn2.48xlarge: 4 x 1900 GB NVMe instance store on EC2 (the EC2 instance page; not re-checked from this machine)
LOCAL_NVME_FAMILIES = ("trn1", "trn1n", "trn2")
# Room beyond the weights on the EBS volume: tokenizer and config files, compiled graphs in compiled/,
# the checkpoint's own dtype when it is wider than the config's (20 %), and the container's scratch.
VOLUME_MARGIN = 1.2
VOLUME_SPARE_GB = 20
MAX_VOLUME_GB = 512  # botocore sagemaker ProductionVariantVolumeSizeInGB


def has_local_nvme(ml_instance_type: str) -> bool:
    return ml_instance_type.removeprefix(ML_PREFIX).split(".")[0] in LOCAL_NVME_FAMILIES


def volume_size_gb(weight_bytes: int) -> int:
    """The EBS volume for an instance without local disk: the weights with margin, in GiB (EBS's GB).

    A config that passed the topology rules fits in its inf2's HBM (at most 384 GiB on inf2.48xlarge,
    three quarters of it usable), so this stays well under MAX_VOLUME_GB."""
    return math.ceil(weight_bytes / 2**30 * VOLUME_MARGIN) + VOLUME_SPARE_GB


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
                "not a SageMaker-hosted Neuron instance type" + hint,
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
