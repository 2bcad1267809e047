"""The boto3 clients a SageMaker deployment needs, bound to one region (boto3 imported lazily)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from neuron_ssp.deploy import aws


@dataclass(frozen=True)
class SageMakerClients:
    region: str
    sagemaker: Any
    runtime: Any
    autoscaling: Any
    logs: Any
    ecr: Any
    sts: Any

    @classmethod
    def for_region(cls, region: str | None, session: Any = None) -> SageMakerClients:
        region = aws.check_region(region)
        session = session if session is not None else aws.new_session()  # says how to install boto3 if missing
        from botocore.config import Config

        config = Config(retries={"mode": "standard", "max_attempts": 5}, user_agent_extra="neuron-ssp-deploy")

        def client(name: str) -> Any:
            return session.client(name, region_name=region, config=config)

        return cls(
            region,
            client("sagemaker"),
            client("sagemaker-runtime"),
            client("application-autoscaling"),
            client("logs"),
            client("ecr"),
            client("sts"),
        )
