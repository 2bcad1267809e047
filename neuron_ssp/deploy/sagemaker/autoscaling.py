"""Application Auto Scaling for an endpoint variant: the instance count follows the load.

The target comes from the batch capacity: an instance runs `slots` requests at once (the serving batch,
`neuron_ssp.serve.capacity.serving_batch`: serve.max_batch within the batch the target was compiled for, 1 for an
engine that serves one request at a time and for LMI), and the rest wait in its queue. As an M/M/c queue
(queueing.py) with c = slots, the default keeps the slots ~50 % busy: at batch 1 that is M/M/1's L = 1
(a request waits one generation on average); at batch 4, L ~ 2.2 and a request waits ~0.09 of a generation, and
the instance carries up to four times the requests before autoscaling buys another at $13-22/h (four times where a
batch-4 step costs what a batch-1 step does: the concurrency target needs no such figure; the invocations one
takes each request's time at that batch from topology/batch_projection.py and says so).

Metrics, as botocore's application-autoscaling service model (2016-02-06, `MetricType`) names them for a
SageMaker variant: SageMakerVariantConcurrentRequestsPerModelHighResolution (requests a model container holds,
queued ones included, 10-second data; one container per instance here, so per model = per instance) and
SageMakerVariantInvocationsPerInstance (per minute). ...ConcurrentRequestsPerCopyHighResolution and
...InvocationsPerCopy are for inference components, which these endpoints do not use.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from neuron_ssp.deploy.sagemaker.queueing import SlotQueue, at_concurrency

NAMESPACE = "sagemaker"
DIMENSION = "sagemaker:variant:DesiredInstanceCount"
VARIANT = "AllTraffic"
METRICS = {
    "concurrency": "SageMakerVariantConcurrentRequestsPerModelHighResolution",
    "invocations": "SageMakerVariantInvocationsPerInstance",
}
ScalingMetric = Literal["concurrency", "invocations"]
DEFAULT_UTILISATION = 0.5  # of the slots; at batch 1 it is the M/M/1 target L = 1 this module always had
SCALE_OUT_COOLDOWN_S = 300  # a new inf2/trn1 instance needs minutes to load a 70B model: don't pile on
SCALE_IN_COOLDOWN_S = 900


@dataclass(frozen=True)
class Capacity:
    """Requests one instance runs at once, and why."""

    slots: int = 1
    reason: str = "batch 1: one request at a time"


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
    metric: ScalingMetric,
    target_value: float | None,
    seconds_per_request: float | None,
    capacity: Capacity = Capacity(),
) -> tuple[float, str]:
    """The target value and the sentence that explains it from the instance's batch capacity."""
    slots = capacity.slots
    if metric == "concurrency":
        if target_value is None:
            target_value = round(SlotQueue(slots, DEFAULT_UTILISATION).in_system, 1)
        queue = at_concurrency(slots, target_value)
        return target_value, (
            f"{target_value:g} concurrent request(s) per instance: it runs {slots} at once ({capacity.reason}), "
            f"so by M/M/{slots} its slots are ~{queue.utilisation:.0%} busy and a request waits "
            f"~{queue.wait_in_generations:.2g} generation(s) on average before it starts"
        )
    if target_value is not None:
        return target_value, f"{target_value:g} invocations per instance per minute (given)"
    if not seconds_per_request:
        raise ValueError("seconds_per_request is needed to derive an invocations target")
    queue = SlotQueue(slots, DEFAULT_UTILISATION)
    value = max(1.0, round(DEFAULT_UTILISATION * slots * 60 / seconds_per_request, 1))
    basis = (
        f"the published batch-1 ms/token scaled to batch {slots} by the bytes a call reads, the weights once for "
        "all rows plus each row's KV cache (topology/batch_projection.py: an assumption; measure with bench-serve "
        "and pass --target-value)"
        if slots > 1
        else "the published ms/token at batch 1"
    )
    return value, (
        f"{value:g} invocations per instance per minute: it runs {slots} at once ({capacity.reason}) at "
        f"~{seconds_per_request:.1f} s per request (plain decoding of generation.max_new_tokens at {basis}; no "
        f"speedup from speculation counted), so {slots} × 60 / that a minute at full load; half of it keeps the "
        f"slots ~50 % busy (M/M/{slots}: a request waits ~{queue.wait_in_generations:.2g} generation(s))"
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
