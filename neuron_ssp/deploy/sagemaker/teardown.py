"""Delete an endpoint's five pieces, whichever exist: safe to run twice, and after a failed create."""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from neuron_ssp.deploy.errors import translatable
from neuron_ssp.deploy.sagemaker import autoscaling
from neuron_ssp.deploy.sagemaker.aws import SageMakerClients
from neuron_ssp.deploy.sagemaker.errors import find_existing, translate_sagemaker

PIECES = ("scaling", "endpoint", "endpoint config", "model")  # in the order they are deleted


@dataclass
class Created:
    """What create_endpoint has asked SageMaker for, and which of it SageMaker confirmed.

    A piece counts as sent from the moment its request goes out: a lost answer (a timeout, a botocore
    retry told "already existing", Ctrl-C mid-call) can hide a piece that exists, so cleanup looks up
    every piece sent. The name was checked free before anything was sent, so what it finds is ours.
    """

    sent: list[str] = field(default_factory=list)
    made: set[str] = field(default_factory=set)

    def request(self, piece: str, call: Callable[[], object]) -> None:
        self.sent.append(piece)
        call()
        self.made.add(piece)


@dataclass
class Removal:
    deleted: list[str] = field(default_factory=list)  # pieces that existed and were deleted
    left: list[str] = field(default_factory=list)  # "piece (why)" for each that could not be deleted


def delete_endpoint(clients: SageMakerClients, name: str, only: Collection[str] = PIECES) -> Removal:
    """Remove scaling policy, scalable target, endpoint, endpoint config, model: those that exist.

    `only` limits it to what a failed create sent. Each piece is described before it is deleted: under
    the operator policy a delete of a missing resource is refused (its tag condition cannot match) where
    a describe says "not found", so running it twice stays safe.
    """
    removal = Removal()
    config_name, models = name, [name]

    def attempt(piece: str, service_prefix: str, action: Callable[[], bool]) -> None:
        try:
            if action() and piece not in removal.deleted:
                removal.deleted.append(piece)
        except translatable() as exc:
            why = translate_sagemaker(exc, service_prefix, region=clients.region).problems[0].rule
            removal.left.append(f"{piece} ({why})")

    def endpoint_step() -> bool:
        nonlocal config_name
        found = find_existing(lambda: clients.sagemaker.describe_endpoint(EndpointName=name))
        if found:
            config_name = found.get("EndpointConfigName", name)
            clients.sagemaker.delete_endpoint(EndpointName=name)
        return found is not None

    def config_step() -> bool:
        nonlocal models
        found = find_existing(lambda: clients.sagemaker.describe_endpoint_config(EndpointConfigName=config_name))
        if found:
            models = [v["ModelName"] for v in found["ProductionVariants"] if v.get("ModelName")] or [name]
            clients.sagemaker.delete_endpoint_config(EndpointConfigName=config_name)
        return found is not None

    def model_step(model: str) -> bool:
        found = find_existing(lambda: clients.sagemaker.describe_model(ModelName=model))
        if found:
            clients.sagemaker.delete_model(ModelName=model)
        return found is not None

    if "scaling" in only:
        attempt("scaling", "application-autoscaling", lambda: _delete_scaling(clients, name))
    if "endpoint" in only:
        attempt("endpoint", "sagemaker", endpoint_step)
    if "endpoint config" in only:
        attempt("endpoint config", "sagemaker", config_step)
    if "model" in only:
        for model in models:
            attempt("model", "sagemaker", lambda model=model: model_step(model))
    return removal


def _delete_scaling(clients: SageMakerClients, name: str) -> bool:
    found = False
    for policy in autoscaling.describe_policies(clients.autoscaling, name):
        found = True
        clients.autoscaling.delete_scaling_policy(
            PolicyName=policy["PolicyName"],
            ServiceNamespace=autoscaling.NAMESPACE,
            ResourceId=autoscaling.resource_id(name),
            ScalableDimension=autoscaling.DIMENSION,
        )
    if autoscaling.describe_target(clients.autoscaling, name) is not None:
        found = True
        clients.autoscaling.deregister_scalable_target(
            ServiceNamespace=autoscaling.NAMESPACE,
            ResourceId=autoscaling.resource_id(name),
            ScalableDimension=autoscaling.DIMENSION,
        )
    return found
