"""Create, inspect, scale, list and delete endpoints; never leave something billing by accident.

`create_endpoint` records each resource as it is created. If anything fails afterwards (the endpoint
goes to Failed, a timeout, Ctrl-C, an AWS error) it shows SageMaker's FailureReason with the tail of
the CloudWatch log and deletes what it created, or with keep_on_failure says what still bills.
`delete_endpoint` removes whatever of the five pieces exists, so it is safe to run twice.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from rich.console import Console

from neuron_ssp.deploy import tags
from neuron_ssp.deploy.errors import translatable
from neuron_ssp.deploy.sagemaker import autoscaling
from neuron_ssp.deploy.sagemaker.aws import SageMakerClients
from neuron_ssp.deploy.sagemaker.cloudwatch import log_group, tail
from neuron_ssp.deploy.sagemaker.errors import is_not_found, sagemaker_errors, translate_sagemaker
from neuron_ssp.deploy.sagemaker.instances import hosting_price
from neuron_ssp.deploy.sagemaker.plan import (
    DOWNLOAD_TIMEOUT_S,
    INSTANCE_TYPE_KEY,
    STARTUP_TIMEOUT_S,
    EndpointPlan,
)
from neuron_ssp.deploy.waiting import Pacing, wait_until
from neuron_ssp.errors import NeuronSSPError, Problem, RuntimeProblem, UsageError

PROVISIONING_S = 30 * 60
ENDPOINT_TIMEOUT_S = PROVISIONING_S + DOWNLOAD_TIMEOUT_S + STARTUP_TIMEOUT_S
LOG_LINES_ON_FAILURE = 40


@dataclass
class Created:
    """What create_endpoint has made so far, in creation order."""

    model: bool = False
    endpoint_config: bool = False
    endpoint: bool = False
    scaling: bool = False


# ---------------------------------------------------------------- create


def create_endpoint(
    plan: EndpointPlan, clients: SageMakerClients, *, pacing: Pacing, console: Console
) -> dict[str, Any]:
    """Create model, endpoint config, endpoint; wait for InService; attach autoscaling."""
    created = Created()
    context = {
        "region": plan.region,
        "instance_type": plan.ml_instance_type,
        "instances": plan.max_instances,
        "role_arn": plan.model_request["ExecutionRoleArn"],
    }
    try:
        with sagemaker_errors("sagemaker", **context):
            clients.sagemaker.create_model(**plan.model_request)
            created.model = True
            console.print(f"[green]✓[/green] model {plan.name} ({plan.engine}, {plan.image_uri})")
            clients.sagemaker.create_endpoint_config(**plan.endpoint_config_request)
            created.endpoint_config = True
            console.print(f"[green]✓[/green] endpoint config {plan.name} ({plan.instances} × {plan.ml_instance_type})")
            clients.sagemaker.create_endpoint(**plan.endpoint_request)
            created.endpoint = True
        console.print(
            f"endpoint {plan.name} is being created: it bills "
            f"{plan.price.text(plan.instances)} from now until it is deleted"
        )
        wait_in_service(clients, plan.name, pacing, console)
        if plan.scaling is not None:
            with sagemaker_errors("application-autoscaling", **context):
                clients.autoscaling.register_scalable_target(**plan.scaling.register_request())
                created.scaling = True
                clients.autoscaling.put_scaling_policy(**plan.scaling.policy_request())
            console.print(
                f"[green]✓[/green] autoscaling {plan.scaling.min_instances}-{plan.scaling.max_instances} "
                f"instances on {plan.scaling.metric}, target {plan.scaling.target_value:g}"
            )
        with sagemaker_errors("sagemaker", **context):
            return clients.sagemaker.describe_endpoint(EndpointName=plan.name)
    except (KeyboardInterrupt, NeuronSSPError) as exc:
        raise _abandon(created, _cause(exc, plan), plan, clients) from None
    except Exception:
        _abandon(created, [], plan, clients)  # a bug of ours: still never leave an endpoint behind
        raise


def check_name_free(clients: SageMakerClients, name: str) -> None:
    """Refuse a name whose endpoint, endpoint config or model exists (read-only, before creating)."""
    with sagemaker_errors("sagemaker", region=clients.region):
        endpoint = _find(lambda: clients.sagemaker.describe_endpoint(EndpointName=name))
        config = _find(lambda: clients.sagemaker.describe_endpoint_config(EndpointConfigName=name))
        model = _find(lambda: clients.sagemaker.describe_model(ModelName=name))
    taken = [f"endpoint ({endpoint['EndpointStatus']})"] if endpoint else []
    taken += ["endpoint config"] * bool(config) + ["model"] * bool(model)
    if taken:
        raise UsageError(
            Problem(
                "--name",
                name,
                f"already in use in {clients.region}: {', '.join(taken)}",
                f"delete it first (`neuron-ssp deploy endpoint delete {name} --region "
                f"{clients.region}`) or pass another --name",
            )
        )


def wait_in_service(clients: SageMakerClients, name: str, pacing: Pacing, console: Console) -> None:
    def check() -> tuple[bool, str]:
        with sagemaker_errors("sagemaker", region=clients.region):
            endpoint = clients.sagemaker.describe_endpoint(EndpointName=name)
        status = endpoint["EndpointStatus"]
        if status == "Failed":
            raise RuntimeProblem(failure_problems(clients, name, endpoint.get("FailureReason", "no reason given")))
        return status == "InService", status

    wait_until(
        f"endpoint {name} InService",
        check,
        timeout_s=ENDPOINT_TIMEOUT_S,
        pacing=pacing,
        console=console,
        fix=f"read the container log: neuron-ssp deploy endpoint logs {name} --region {clients.region}",
    )


def failure_problems(clients: SageMakerClients, name: str, reason: str) -> list[Problem]:
    """FailureReason plus what the container printed last (its CloudWatch log)."""
    try:
        lines = tail(clients.logs, name, LOG_LINES_ON_FAILURE, region=clients.region)
    except NeuronSSPError as exc:
        lines = [f"(could not read {log_group(name)}: {exc.problems[0].rule})"]
    log_text = "\n".join(lines) if lines else f"(no log in {log_group(name)}: the container never started)"
    return [
        Problem(
            "endpoint",
            name,
            f"went to Failed: {reason}",
            "read the container log below; fix the model prefix, role or config and create again",
        ),
        Problem(
            "container log",
            log_group(name),
            "last lines:\n" + log_text,
            f"more with: neuron-ssp deploy endpoint logs {name} --region {clients.region}",
        ),
    ]


def _cause(exc: BaseException, plan: EndpointPlan) -> list[Problem]:
    if isinstance(exc, NeuronSSPError):
        return exc.problems
    return [
        Problem(
            "create",
            "Ctrl-C",
            "interrupted before the endpoint was InService",
            f"create again when ready (`neuron-ssp deploy endpoint create ... --name {plan.name}`)",
        )
    ]


def _abandon(created: Created, cause: list[Problem], plan: EndpointPlan, clients: SageMakerClients) -> RuntimeProblem:
    """After a failure: delete what was created, or (keep_on_failure) say what still bills."""
    pieces = [
        kind
        for kind, made in (
            ("scaling", created.scaling),
            ("endpoint", created.endpoint),
            ("endpoint config", created.endpoint_config),
            ("model", created.model),
        )
        if made
    ]
    if not pieces:
        return RuntimeProblem(cause)
    billing = f"{plan.instances} × {plan.ml_instance_type} in {plan.region} at {plan.price.text(plan.instances)}"
    if plan.keep_on_failure:
        what = f"kept after the failure: {', '.join(pieces)}"
        if created.endpoint:
            what += f"; the endpoint bills {billing} until it is deleted"
        return RuntimeProblem(
            [
                *cause,
                Problem(
                    "endpoint",
                    plan.name,
                    what,
                    f"inspect it, then `neuron-ssp deploy endpoint delete {plan.name} --region {plan.region}`",
                ),
            ]
        )
    try:
        left = delete_endpoint(clients, plan.name, only=created)
    except KeyboardInterrupt:
        left = [f"{', '.join(pieces)} (interrupted while deleting)"]
    if left:
        return RuntimeProblem(
            [
                *cause,
                Problem(
                    "endpoint",
                    plan.name,
                    f"could NOT delete {', '.join(left)}"
                    + (f"; it may still bill {billing}" if created.endpoint else ""),
                    f"run `neuron-ssp deploy endpoint delete {plan.name} --region {plan.region}` "
                    f"(or aws sagemaker delete-endpoint --endpoint-name {plan.name} --region {plan.region})",
                ),
            ]
        )
    return RuntimeProblem(
        [
            *cause,
            Problem(
                "endpoint",
                plan.name,
                f"deleted what was created ({', '.join(pieces)}); nothing is left billing",
                "fix the cause above and create again; --keep-on-failure keeps the endpoint for debugging",
            ),
        ]
    )


# ---------------------------------------------------------------- delete


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
        found = _find(lambda: clients.sagemaker.describe_endpoint(EndpointName=name))
        if found:
            config_name = found.get("EndpointConfigName", name)
            clients.sagemaker.delete_endpoint(EndpointName=name)

    def config_step() -> None:
        nonlocal models
        found = _find(lambda: clients.sagemaker.describe_endpoint_config(EndpointConfigName=config_name))
        if found:
            models = [v["ModelName"] for v in found["ProductionVariants"] if v.get("ModelName")] or [name]
            clients.sagemaker.delete_endpoint_config(EndpointConfigName=config_name)

    def model_step(model: str) -> None:
        if _find(lambda: clients.sagemaker.describe_model(ModelName=model)):
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


def _find(describe: Callable[[], dict[str, Any]]) -> dict[str, Any] | None:
    """The description, or None when SageMaker says the resource does not exist."""
    try:
        return describe()
    except translatable() as exc:
        if is_not_found(exc):
            return None
        raise


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


def _describe_or_none(clients: SageMakerClients, name: str) -> dict[str, Any] | None:
    try:
        return clients.sagemaker.describe_endpoint(EndpointName=name)
    except translatable() as exc:
        if is_not_found(exc):
            return None
        raise translate_sagemaker(exc, "sagemaker", region=clients.region) from None


# ---------------------------------------------------------------- status / list / scale


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
            "engine": self.engine,
            "usd_per_hour": self.usd_per_hour,
            "price_source": hosting_price(self.instance_type).source,
            "failure_reason": self.failure_reason,
        }


def endpoint_info(clients: SageMakerClients, name: str) -> EndpointInfo:
    with sagemaker_errors("sagemaker", region=clients.region):
        endpoint = _describe_or_none(clients, name)
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
    return _info(endpoint, found, target)


def _info(endpoint: dict[str, Any], found_tags: dict[str, str], target: dict[str, Any] | None) -> EndpointInfo:
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
        engine=found_tags.get("neuron-ssp:engine", "?"),
        failure_reason=endpoint.get("FailureReason"),
    )


def list_endpoints(clients: SageMakerClients) -> list[EndpointInfo]:
    """Endpoints tagged Project=neuron-ssp in the region."""
    out = []
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
            out.append(_info(endpoint, found, None))
    return out


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


def now_utc() -> datetime:
    return datetime.now(timezone.utc)
