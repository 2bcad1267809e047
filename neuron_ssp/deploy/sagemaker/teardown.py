"""Delete an endpoint's five pieces, whichever exist: safe to run twice, and after a failed create."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from neuron_ssp.deploy.errors import translatable
from neuron_ssp.deploy.sagemaker import autoscaling
from neuron_ssp.deploy.sagemaker.aws import SageMakerClients
from neuron_ssp.deploy.sagemaker.errors import find_existing, translate_sagemaker


@dataclass
class Created:
    """What create_endpoint has made so far, in creation order."""

    model: bool = False
    endpoint_config: bool = False
    endpoint: bool = False
    scaling: bool = False


def delete_endpoint(clients: SageMakerClients, name: str, only: Created | None = None) -> list[str]:
    """Remove scaling policy, scalable target, endpoint, endpoint config, model: those that exist.

    Returns the pieces that could not be deleted ([] = all gone). `only` limits it to what a failed
    create made. Each piece is described before it is deleted: under the operator policy a delete of a
    missing resource is refused (its tag condition cannot match) where a describe says "not found", so
    running it twice stays safe.
    """
    wanted = only or Created(model=True, endpoint_config=True, endpoint=True, scaling=True)
    left: list[str] = []
    config_name, models = name, [name]

    def attempt(piece: str, service_prefix: str, action: Callable[[], None]) -> None:
        try:
            action()
        except translatable() as exc:
            left.append(f"{piece} ({translate_sagemaker(exc, service_prefix, region=clients.region).problems[0].rule})")

    def endpoint_step() -> None:
        nonlocal config_name
        found = find_existing(lambda: clients.sagemaker.describe_endpoint(EndpointName=name))
        if found:
            config_name = found.get("EndpointConfigName", name)
            clients.sagemaker.delete_endpoint(EndpointName=name)

    def config_step() -> None:
        nonlocal models
        found = find_existing(lambda: clients.sagemaker.describe_endpoint_config(EndpointConfigName=config_name))
        if found:
            models = [v["ModelName"] for v in found["ProductionVariants"] if v.get("ModelName")] or [name]
            clients.sagemaker.delete_endpoint_config(EndpointConfigName=config_name)

    def model_step(model: str) -> None:
        if find_existing(lambda: clients.sagemaker.describe_model(ModelName=model)):
            clients.sagemaker.delete_model(ModelName=model)

    if wanted.scaling:
        attempt("scaling", "application-autoscaling", lambda: _delete_scaling(clients, name))
    if wanted.endpoint:
        attempt("endpoint", "sagemaker", endpoint_step)
    if wanted.endpoint_config:
        attempt("endpoint config", "sagemaker", config_step)
    if wanted.model:
        for model in models:
            attempt("model", "sagemaker", lambda model=model: model_step(model))
    return left


def _delete_scaling(clients: SageMakerClients, name: str) -> None:
    for policy in autoscaling.describe_policies(clients.autoscaling, name):
        clients.autoscaling.delete_scaling_policy(
            PolicyName=policy["PolicyName"],
            ServiceNamespace=autoscaling.NAMESPACE,
            ResourceId=autoscaling.resource_id(name),
            ScalableDimension=autoscaling.DIMENSION,
        )
    if autoscaling.describe_target(clients.autoscaling, name) is not None:
        clients.autoscaling.deregister_scalable_target(
            ServiceNamespace=autoscaling.NAMESPACE,
            ResourceId=autoscaling.resource_id(name),
            ScalableDimension=autoscaling.DIMENSION,
        )
