"""Change an endpoint's capacity: the autoscaling range, or the instance count now."""

from __future__ import annotations

from neuron_ssp.deploy.sagemaker import autoscaling
from neuron_ssp.deploy.sagemaker.aws import SageMakerClients
from neuron_ssp.deploy.sagemaker.errors import sagemaker_errors
from neuron_ssp.deploy.sagemaker.inventory import EndpointInfo, endpoint_info
from neuron_ssp.errors import Problem, UsageError


def scale(
    clients: SageMakerClients, name: str, *, min_instances: int | None, max_instances: int | None, instances: int | None
) -> EndpointInfo:
    """Change the autoscaling range and/or the instance count now."""
    info = endpoint_info(clients, name)
    low = min_instances if min_instances is not None else info.min_instances
    high = max_instances if max_instances is not None else info.max_instances
    problems = []
    if (min_instances is not None or max_instances is not None) and (low is None or high is None):
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
    if problems:
        raise UsageError(problems)
    if min_instances is not None or max_instances is not None:
        with sagemaker_errors("application-autoscaling", region=clients.region, instances=high):
            clients.autoscaling.register_scalable_target(
                ServiceNamespace=autoscaling.NAMESPACE,
                ResourceId=autoscaling.resource_id(name),
                ScalableDimension=autoscaling.DIMENSION,
                MinCapacity=low,
                MaxCapacity=high,
            )
            if not autoscaling.describe_policies(clients.autoscaling, name):
                plan = autoscaling.ScalingPlan(
                    name, low, high, "concurrency", *autoscaling.target_for("concurrency", None, None)
                )
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
