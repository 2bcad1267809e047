"""Create an endpoint and wait for it; never leave something billing by accident.

`create_endpoint` records each resource as its request is sent, before the answer: an answer can be
lost (a timeout, a botocore retry told "already existing", Ctrl-C) while the resource exists. If
anything fails (the endpoint goes to Failed, a timeout, Ctrl-C, an AWS error) it shows SageMaker's
FailureReason with the tail of the CloudWatch log and looks up and deletes every piece it asked for,
or with keep_on_failure says what still bills.
"""

from __future__ import annotations

from typing import Any

from neuron_ssp.deploy.progress import Progress
from neuron_ssp.deploy.sagemaker.aws import SageMakerClients
from neuron_ssp.deploy.sagemaker.cloudwatch import log_group, tail
from neuron_ssp.deploy.sagemaker.errors import find_existing, sagemaker_errors
from neuron_ssp.deploy.sagemaker.plan import DOWNLOAD_TIMEOUT_S, STARTUP_TIMEOUT_S, EndpointPlan
from neuron_ssp.deploy.sagemaker.teardown import PIECES, Created, Removal, delete_endpoint
from neuron_ssp.deploy.waiting import Pacing, wait_until
from neuron_ssp.errors import NeuronSSPError, Problem, RuntimeProblem, UsageError

PROVISIONING_S = 30 * 60
ENDPOINT_TIMEOUT_S = PROVISIONING_S + DOWNLOAD_TIMEOUT_S + STARTUP_TIMEOUT_S
LOG_LINES_ON_FAILURE = 40


def create_endpoint(
    plan: EndpointPlan, clients: SageMakerClients, *, pacing: Pacing, progress: Progress
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
            created.request("model", lambda: clients.sagemaker.create_model(**plan.model_request))
            progress.done(f"model {plan.name} ({plan.engine}, {plan.image_uri})")
            created.request(
                "endpoint config", lambda: clients.sagemaker.create_endpoint_config(**plan.endpoint_config_request)
            )
            progress.done(f"endpoint config {plan.name} ({plan.instances} × {plan.ml_instance_type})")
            created.request("endpoint", lambda: clients.sagemaker.create_endpoint(**plan.endpoint_request))
        progress.note(
            f"endpoint {plan.name} is being created: it bills "
            f"{plan.price.text(plan.instances)} from now until it is deleted"
        )
        wait_in_service(clients, plan.name, pacing, progress)
        if plan.scaling is not None:
            scaling = plan.scaling
            with sagemaker_errors("application-autoscaling", **context):
                created.request(
                    "scaling", lambda: clients.autoscaling.register_scalable_target(**scaling.register_request())
                )
                clients.autoscaling.put_scaling_policy(**scaling.policy_request())
            progress.done(
                f"autoscaling {plan.scaling.min_instances}-{plan.scaling.max_instances} "
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
        endpoint = find_existing(lambda: clients.sagemaker.describe_endpoint(EndpointName=name))
        config = find_existing(lambda: clients.sagemaker.describe_endpoint_config(EndpointConfigName=name))
        model = find_existing(lambda: clients.sagemaker.describe_model(ModelName=name))
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


def wait_in_service(clients: SageMakerClients, name: str, pacing: Pacing, progress: Progress) -> None:
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
        progress=progress,
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
    """After a failure: look up and delete every piece asked for, or (keep_on_failure) say what still bills."""
    if not created.sent:
        return RuntimeProblem(cause)
    billing = f"{plan.instances} × {plan.ml_instance_type} in {plan.region} at {plan.price.text(plan.instances)}"
    if plan.keep_on_failure:
        made = [piece for piece in PIECES if piece in created.made]
        unsure = [piece for piece in PIECES if piece in created.sent and piece not in created.made]
        what = f"kept after the failure: {', '.join(made) or 'nothing confirmed'}"
        if unsure:
            what += f"; maybe also {', '.join(unsure)} (asked for, the answer was lost)"
        if "endpoint" in created.sent:
            what += f"; the endpoint {'bills' if 'endpoint' in made else 'would bill'} {billing} until it is deleted"
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
        removal = delete_endpoint(clients, plan.name, only=created.sent)
    except KeyboardInterrupt:
        removal = Removal(left=[f"{', '.join(created.sent)} (interrupted while deleting)"])
    if removal.left:
        return RuntimeProblem(
            [
                *cause,
                Problem(
                    "endpoint",
                    plan.name,
                    f"could NOT delete {', '.join(removal.left)}"
                    + (f"; it may still bill {billing}" if "endpoint" in created.sent else ""),
                    f"run `neuron-ssp deploy endpoint delete {plan.name} --region {plan.region}` "
                    f"(or aws sagemaker delete-endpoint --endpoint-name {plan.name} --region {plan.region})",
                ),
            ]
        )
    if not removal.deleted:
        return RuntimeProblem(cause)  # what was asked for was refused: nothing exists
    return RuntimeProblem(
        [
            *cause,
            Problem(
                "endpoint",
                plan.name,
                f"deleted what was created ({', '.join(removal.deleted)}); nothing is left billing",
                "fix the cause above and create again; --keep-on-failure keeps the endpoint for debugging",
            ),
        ]
    )
