"""Application Auto Scaling for an endpoint variant: the instance count follows the load.

Why the default target is 1 concurrent request per model: speculation on Neuron decodes one sequence
at a time per model copy (batch size 1, for transformers-neuronx's speculative forward as for LMI), so
requests beyond the first wait in line. With Poisson arrivals (M/M/1) the mean number in the system
is L = rho / (1 - rho): L = 1 means each instance is busy about half the time and a request waits on
average one generation before it starts. A higher target packs instances tighter and lengthens that
wait (L = 3: 75 % busy, three generations of waiting); a lower one buys latency with idle instances.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

NAMESPACE = "sagemaker"
DIMENSION = "sagemaker:variant:DesiredInstanceCount"
VARIANT = "AllTraffic"
METRICS = {
    "concurrency": "SageMakerVariantConcurrentRequestsPerModelHighResolution",
    "invocations": "SageMakerVariantInvocationsPerInstance",
}
ScalingMetric = Literal["concurrency", "invocations"]
DEFAULT_CONCURRENCY_TARGET = 1.0
SCALE_OUT_COOLDOWN_S = 300  # a new inf2/trn1 instance needs minutes to load a 70B model: don't pile on
SCALE_IN_COOLDOWN_S = 900


@dataclass(frozen=True)
class ScalingPlan:
    endpoint: str
    min_instances: int
    max_instances: int
    metric: ScalingMetric
    target_value: float
    explanation: str

    @property
    def resource_id(self) -> str:
        return resource_id(self.endpoint)

    @property
    def policy_name(self) -> str:
        return policy_name(self.endpoint)

    def register_request(self) -> dict[str, Any]:
        return {
            "ServiceNamespace": NAMESPACE,
            "ResourceId": self.resource_id,
            "ScalableDimension": DIMENSION,
            "MinCapacity": self.min_instances,
            "MaxCapacity": self.max_instances,
        }

    def policy_request(self) -> dict[str, Any]:
        return {
            "PolicyName": self.policy_name,
            "ServiceNamespace": NAMESPACE,
            "ResourceId": self.resource_id,
            "ScalableDimension": DIMENSION,
            "PolicyType": "TargetTrackingScaling",
            "TargetTrackingScalingPolicyConfiguration": {
                "TargetValue": self.target_value,
                "PredefinedMetricSpecification": {"PredefinedMetricType": METRICS[self.metric]},
                "ScaleOutCooldown": SCALE_OUT_COOLDOWN_S,
                "ScaleInCooldown": SCALE_IN_COOLDOWN_S,
            },
        }


def resource_id(endpoint: str) -> str:
    return f"endpoint/{endpoint}/variant/{VARIANT}"


def policy_name(endpoint: str) -> str:
    return f"{endpoint}-target-tracking"


def target_for(
    metric: ScalingMetric, target_value: float | None, seconds_per_request: float | None
) -> tuple[float, str]:
    """The target value and the sentence that explains it from batch-1 speculation."""
    if metric == "concurrency":
        value = DEFAULT_CONCURRENCY_TARGET if target_value is None else target_value
        utilisation = value / (1 + value)
        return value, (
            f"{value:g} concurrent request(s) per model: one copy decodes one sequence at a time "
            f"(batch 1), so by M/M/1 each instance is ~{utilisation:.0%} busy and a request waits "
            f"~{value:g} generation(s) on average before it starts"
        )
    if target_value is not None:
        return target_value, f"{target_value:g} invocations per instance per minute (given)"
    if not seconds_per_request:
        raise ValueError("seconds_per_request is needed to derive an invocations target")
    value = max(1.0, round(0.5 * 60 / seconds_per_request, 1))
    return value, (
        f"{value:g} invocations per instance per minute: at ~{seconds_per_request:.1f} s per request "
        "(batch 1) an instance serves 60/that a minute; half of it keeps it ~50 % busy (M/M/1: a "
        "request waits ~one generation)"
    )


def apply(autoscaling: Any, plan: ScalingPlan) -> None:
    autoscaling.register_scalable_target(**plan.register_request())
    autoscaling.put_scaling_policy(**plan.policy_request())


def describe_target(autoscaling: Any, endpoint: str) -> dict[str, Any] | None:
    found = autoscaling.describe_scalable_targets(
        ServiceNamespace=NAMESPACE, ResourceIds=[resource_id(endpoint)], ScalableDimension=DIMENSION
    )["ScalableTargets"]
    return found[0] if found else None


def describe_policies(autoscaling: Any, endpoint: str) -> list[dict[str, Any]]:
    return autoscaling.describe_scaling_policies(
        ServiceNamespace=NAMESPACE, ResourceId=resource_id(endpoint), ScalableDimension=DIMENSION
    )["ScalingPolicies"]


def all_targets(autoscaling: Any) -> dict[str, dict[str, Any]]:
    """Every endpoint variant's scalable target in the region, by ResourceId (one paginated call for `list`)."""
    pages = autoscaling.get_paginator("describe_scalable_targets").paginate(
        ServiceNamespace=NAMESPACE, ScalableDimension=DIMENSION
    )
    return {t["ResourceId"]: t for page in pages for t in page["ScalableTargets"]}


def all_policies(autoscaling: Any) -> dict[str, list[dict[str, Any]]]:
    """Every endpoint variant's scaling policies in the region, by ResourceId."""
    pages = autoscaling.get_paginator("describe_scaling_policies").paginate(ServiceNamespace=NAMESPACE)
    found: dict[str, list[dict[str, Any]]] = {}
    for page in pages:
        for policy in page["ScalingPolicies"]:
            found.setdefault(policy["ResourceId"], []).append(policy)
    return found


def tracked_metric(policies: Sequence[dict[str, Any]]) -> tuple[ScalingMetric, float] | None:
    """(metric, target) of this tool's target-tracking policy, if the endpoint has one we know."""
    names = {metric_type: name for name, metric_type in METRICS.items()}
    for policy in policies:
        tracking = policy.get("TargetTrackingScalingPolicyConfiguration") or {}
        metric_type = (tracking.get("PredefinedMetricSpecification") or {}).get("PredefinedMetricType")
        if metric_type in names:
            return names[metric_type], float(tracking["TargetValue"])
    return None
