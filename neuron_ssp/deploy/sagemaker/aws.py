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
        # InvokeEndpoint gives the container 60 s and its API reference asks for a 70 s socket timeout; a
        # generation is not idempotent, so it is never re-sent into the same queue (docs/serving.md)
        invoke = config.merge(Config(read_timeout=70, retries={"mode": "standard", "total_max_attempts": 1}))

        def client(name: str, settings: Config = config) -> Any:
            return session.client(name, region_name=region, config=settings)

        return cls(
            region,
            client("sagemaker"),
            client("sagemaker-runtime", invoke),
            client("application-autoscaling"),
            client("logs"),
            client("ecr"),
            client("sts"),
        )
