"""Change an endpoint's capacity: the autoscaling range, what it tracks, or the instance count now."""

from __future__ import annotations

from neuron_ssp.deploy.sagemaker import autoscaling
from neuron_ssp.deploy.sagemaker.aws import SageMakerClients
from neuron_ssp.deploy.sagemaker.errors import sagemaker_errors
from neuron_ssp.deploy.sagemaker.inventory import EndpointInfo, endpoint_info
from neuron_ssp.deploy.sagemaker.plan import SERVING_BATCH_KEY
from neuron_ssp.errors import Problem, UsageError


def scale(
    clients: SageMakerClients,
    name: str,
    *,
    min_instances: int | None,
    max_instances: int | None,
    instances: int | None,
    metric: autoscaling.ScalingMetric | None = None,
    target_value: float | None = None,
) -> EndpointInfo:
    """Change the autoscaling range, the tracked metric and its target, and/or the instance count now.

    The policy is rewritten under its own name (PutScalingPolicy updates a policy of the same name), so
    a metric or target change keeps the range, and a range change keeps the metric and target."""
    info = endpoint_info(clients, name)
    low = min_instances if min_instances is not None else info.min_instances
    high = max_instances if max_instances is not None else info.max_instances
    new_range = min_instances is not None or max_instances is not None
    new_policy = metric is not None or target_value is not None
    problems = []
    if (new_range or new_policy) and (low is None or high is None):
        problems.append(
            Problem("--min/--max", (low, high), "no autoscaling yet: give both bounds", "pass --min and --max together")
        )
    elif low is not None and high is not None and not 1 <= low <= high:
        problems.append(Problem("--min/--max", (low, high), "need 1 <= min <= max", "fix the bounds"))
    if instances is not None and (
        instances < 1 or (low is not None and high is not None and not low <= instances <= high)
    ):
        problems.append(
            Problem(
                "--instances",
                instances,
                f"must be >= 1 and within the autoscaling range {low}-{high}",
                "change --instances or the range (--min/--max)",
            )
        )
    if target_value is not None and target_value <= 0:
        problems.append(Problem("--target-value", target_value, "must be > 0", "pass a positive target"))
    current = info.tracked
    chosen = metric or (current[0] if current else "concurrency")
    if chosen == "invocations" and target_value is None and (current is None or current[0] != "invocations"):
        problems.append(
            Problem(
                "--target-value",
                None,
                "the invocations metric needs a target (invocations per instance per minute); "
                "the default is derived from the config's speed at `endpoint create`",
                "pass --target-value, e.g. 30 for ~1 s per request at half load",
            )
        )
    if problems:
        raise UsageError(problems)
    if new_range or new_policy:
        if target_value is None and current is not None and current[0] == chosen:
            target_value = current[1]  # a range change keeps the target it had
        capacity = autoscaling.Capacity(info.serving_batch, f"tag {SERVING_BATCH_KEY} of the endpoint")
        plan = autoscaling.ScalingPlan(
            name, low, high, chosen, *autoscaling.target_for(chosen, target_value, None, capacity)
        )
        with sagemaker_errors("application-autoscaling", region=clients.region, instances=high):
            clients.autoscaling.register_scalable_target(**plan.register_request())
            if new_policy or not info.policies:
                clients.autoscaling.put_scaling_policy(**plan.policy_request())
    if instances is not None:
        with sagemaker_errors(
            "sagemaker", region=clients.region, instance_type=info.instance_type, instances=instances
        ):
            clients.sagemaker.update_endpoint_weights_and_capacities(
                EndpointName=name,
                DesiredWeightsAndCapacities=[{"VariantName": autoscaling.VARIANT, "DesiredInstanceCount": instances}],
            )
    return endpoint_info(clients, name)
