"""What exists: one endpoint's status, instances, autoscaling range and $/h, or all of this tool's."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from neuron_ssp.deploy import tags
from neuron_ssp.deploy.sagemaker import autoscaling
from neuron_ssp.deploy.sagemaker.aws import SageMakerClients
from neuron_ssp.deploy.sagemaker.errors import find_existing, sagemaker_errors
from neuron_ssp.deploy.sagemaker.instances import hosting_price
from neuron_ssp.deploy.sagemaker.plan import ENGINE_KEY, INSTANCE_TYPE_KEY, SERVING_BATCH_KEY
from neuron_ssp.errors import Problem, UsageError


@dataclass(frozen=True)
class EndpointInfo:
    name: str
    status: str
    created: datetime
    instance_type: str
    current_instances: int
    desired_instances: int
    min_instances: int | None
    max_instances: int | None
    engine: str
    failure_reason: str | None
    policies: tuple[dict[str, Any], ...] = ()  # the variant's scaling policies, as AWS describes them
    # requests an instance runs at once, tagged at create; 1 for endpoints made before the tag (Neuron was batch 1)
    serving_batch: int = 1

    @property
    def tracked(self) -> tuple[autoscaling.ScalingMetric, float] | None:
        """(metric, target) of this tool's target-tracking policy, if it has one."""
        return autoscaling.tracked_metric(self.policies)

    @property
    def scaling(self) -> str | None:
        """What autoscaling tracks, e.g. "concurrency 1"."""
        return None if self.tracked is None else f"{self.tracked[0]} {self.tracked[1]:g}"

    def age_hours(self, now: datetime) -> float:
        return max(0.0, (now - self.created).total_seconds() / 3600)

    @property
    def usd_per_hour(self) -> float | None:
        price = hosting_price(self.instance_type).usd_per_hour
        return None if price is None else price * self.current_instances

    def to_dict(self, now: datetime) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "age_hours": round(self.age_hours(now), 2),
            "instance_type": self.instance_type,
            "current_instances": self.current_instances,
            "desired_instances": self.desired_instances,
            "min_instances": self.min_instances,
            "max_instances": self.max_instances,
            "scaling": self.scaling,
            "engine": self.engine,
            "serving_batch": self.serving_batch,
            "usd_per_hour": self.usd_per_hour,
            "price_source": hosting_price(self.instance_type).source,
            "failure_reason": self.failure_reason,
        }


def endpoint_info(clients: SageMakerClients, name: str) -> EndpointInfo:
    with sagemaker_errors("sagemaker", region=clients.region):
        endpoint = find_existing(lambda: clients.sagemaker.describe_endpoint(EndpointName=name))
        if endpoint is None:
            raise UsageError(
                Problem(
                    "NAME",
                    name,
                    f"no endpoint of that name in {clients.region}",
                    f"see `neuron-ssp deploy endpoint list --region {clients.region}`",
                )
            )
        found = {t["Key"]: t["Value"] for t in clients.sagemaker.list_tags(ResourceArn=endpoint["EndpointArn"])["Tags"]}
    with sagemaker_errors("application-autoscaling", region=clients.region):
        target = autoscaling.describe_target(clients.autoscaling, name)
        policies = autoscaling.describe_policies(clients.autoscaling, name) if target else []
    return _info(endpoint, found, target, policies)


def _info(
    endpoint: dict[str, Any],
    found_tags: dict[str, str],
    target: dict[str, Any] | None,
    policies: list[dict[str, Any]],
) -> EndpointInfo:
    variants = endpoint.get("ProductionVariants") or [{}]
    return EndpointInfo(
        name=endpoint["EndpointName"],
        status=endpoint["EndpointStatus"],
        created=endpoint["CreationTime"],
        instance_type=found_tags.get(INSTANCE_TYPE_KEY, "?"),
        current_instances=int(variants[0].get("CurrentInstanceCount", 0)),
        desired_instances=int(variants[0].get("DesiredInstanceCount", 0)),
        min_instances=target["MinCapacity"] if target else None,
        max_instances=target["MaxCapacity"] if target else None,
        engine=found_tags.get(ENGINE_KEY, "?"),
        failure_reason=endpoint.get("FailureReason"),
        policies=tuple(policies),
        serving_batch=_tagged_batch(found_tags.get(SERVING_BATCH_KEY)),
    )


def _tagged_batch(value: str | None) -> int:
    """The serving-batch tag; 1 where it is absent or not a positive whole number (a tag anyone may edit)."""
    return int(value) if value is not None and value.isdigit() and int(value) >= 1 else 1


def list_endpoints(clients: SageMakerClients) -> list[EndpointInfo]:
    """Endpoints tagged Project=neuron-ssp in the region, with their autoscaling ranges."""
    tagged: list[tuple[dict[str, Any], dict[str, str]]] = []
    with sagemaker_errors("sagemaker", region=clients.region):
        pages = clients.sagemaker.get_paginator("list_endpoints").paginate()
        summaries = [s for page in pages for s in page["Endpoints"]]
        for summary in summaries:
            found = {
                t["Key"]: t["Value"] for t in clients.sagemaker.list_tags(ResourceArn=summary["EndpointArn"])["Tags"]
            }
            if found.get(tags.PROJECT_KEY) != tags.PROJECT:
                continue
            endpoint = clients.sagemaker.describe_endpoint(EndpointName=summary["EndpointName"])
            tagged.append((endpoint, found))
    if not tagged:
        return []
    with sagemaker_errors("application-autoscaling", region=clients.region):
        targets = autoscaling.all_targets(clients.autoscaling)
        policies = autoscaling.all_policies(clients.autoscaling)
    infos = []
    for endpoint, found in tagged:
        resource = autoscaling.resource_id(endpoint["EndpointName"])
        infos.append(_info(endpoint, found, targets.get(resource), policies.get(resource, [])))
    return infos


def now_utc() -> datetime:
    return datetime.now(timezone.utc)
