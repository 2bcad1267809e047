"""Launch one instance for one config: read-only lookups, dry run or execution, clean up on failure.

`prepare_launch` checks the config and flags (no AWS call when they are wrong), looks up what planning
needs (name not taken, the DLAMI, the reservation, the caller) and returns the pure plan
(`launch_plan`). `execute_launch` creates the instance and waits for the bootstrap's own verdict
(ready or failed); if anything fails after that (timeout, a failed bootstrap, Ctrl-C, an AWS error) it
terminates the instance, or with keep_on_failure says exactly what is still running and costing.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from neuron_ssp.config import Config
from neuron_ssp.deploy.ami import PINNED, DlamiPin, pin_for_config, resolve_ami
from neuron_ssp.deploy.aws import AwsClients
from neuron_ssp.deploy.bootstrap_wait import wait_bootstrap
from neuron_ssp.deploy.capacity import check_reservation, describe_reservation
from neuron_ssp.deploy.errors import AwsUnreachable, aws_errors, error_code, translatable, translate
from neuron_ssp.deploy.inventory import Deployment, describe, format_usd, list_deployments
from neuron_ssp.deploy.launch_plan import (
    LaunchFacts,
    LaunchOptions,
    LaunchPlan,
    check_launch,
    deployment_name,
    expiry,
    plan_launch,
)
from neuron_ssp.deploy.progress import Progress
from neuron_ssp.deploy.ssm_run import ssm_ping_status
from neuron_ssp.deploy.userdata import FAILURE_SHUTDOWN_MINUTES
from neuron_ssp.deploy.waiting import Pacing, wait_until
from neuron_ssp.errors import NeuronSSPError, Problem, RuntimeProblem, UsageError


@dataclass(frozen=True)
class PermissionCheck:
    action: str
    allowed: bool
    detail: str


# ---------------------------------------------------------------- lookups (read-only)


def prepare_launch(
    config: Config,
    config_path: str | Path,
    options: LaunchOptions,
    clients: AwsClients,
    *,
    now: datetime | None = None,
    client_token: str | None = None,
) -> LaunchPlan:
    """Check config and flags, look up what the plan needs, plan; create nothing."""
    instance_type, _ = check_launch(config, options)  # before any AWS call
    now = now or datetime.now(timezone.utc)
    name = deployment_name(config, config_path, options)
    facts = look_up(name, instance_type, options, clients, expiry(now, options), pin_for_config(config))
    token = client_token or f"neuron-ssp-{uuid.uuid4().hex}"
    return plan_launch(config, config_path, options, facts, now=now, client_token=token)


def look_up(
    name: str,
    instance_type: str,
    options: LaunchOptions,
    clients: AwsClients,
    expires_at: datetime,
    pin: DlamiPin = PINNED,
) -> LaunchFacts:
    """Read-only calls, each stopping the launch as soon as it shows a problem: name, DLAMI, reservation, caller."""
    region = clients.region
    existing = list_deployments(clients.ec2, region, name)
    if existing:
        raise UsageError(
            Problem(
                "--name",
                name,
                f"a deployment of that name is live ({existing[0].instance_id}, {existing[0].state})",
                "tear it down first or pass another --name",
            )
        )
    ami = resolve_ami(options.ami, clients.ec2, clients.ssm, region, pin)
    reservation = None
    if options.capacity:
        reservation = describe_reservation(clients.ec2, options.capacity, region)
        check_reservation(reservation, options.capacity, instance_type, expires_at)
    with aws_errors("sts", region=region):
        owner = clients.sts.get_caller_identity()["Arn"]
    return LaunchFacts(region, ami, owner, reservation)


# ---------------------------------------------------------------- dry run


def check_permissions(plan: LaunchPlan, clients: AwsClients) -> PermissionCheck:
    """EC2 DryRun of the exact request: DryRunOperation = allowed, UnauthorizedOperation = not."""
    from botocore.exceptions import ClientError

    action = "ec2:RunInstances (+ ec2:CreateTags" + (", iam:PassRole)" if "IamInstanceProfile" in plan.params else ")")
    try:
        clients.ec2.run_instances(**plan.params, DryRun=True)
    except ClientError as exc:
        code = error_code(exc)
        if code == "DryRunOperation":
            return PermissionCheck(action, True, "request would have succeeded")
        if code in ("UnauthorizedOperation", "AccessDenied"):
            return PermissionCheck(action, False, exc.response["Error"].get("Message", code))
        raise translate(exc, "ec2", region=plan.region, instance_type=plan.instance_type) from None
    raise RuntimeProblem(
        Problem(
            "--dry-run",
            plan.region,
            "EC2 ignored DryRun=True and answered normally",
            "run `neuron-ssp deploy list` and tear down anything unexpected",
        )
    )


# ---------------------------------------------------------------- execute


def execute_launch(plan: LaunchPlan, clients: AwsClients, *, pacing: Pacing, progress: Progress) -> Deployment:
    """Create the instance, wait until it runs, SSM sees it and its bootstrap is ready; clean up on any failure."""
    try:
        with aws_errors(
            "ec2",
            region=plan.region,
            instance_type=plan.instance_type,
            instance_profile=plan.params.get("IamInstanceProfile"),
        ):
            instance_id = clients.ec2.run_instances(**plan.params)["Instances"][0]["InstanceId"]
    except (KeyboardInterrupt, AwsUnreachable) as exc:
        # The request may have been accepted before the interruption: find it by its client token.
        found = find_by_client_token(plan, clients, pacing)
        if isinstance(found, Problem):
            raise RuntimeProblem([*_as_problem(exc, plan), found]) from None
        raise _abandon(found, _as_problem(exc, plan), plan, clients) from None
    progress.note(f"launched {instance_id} ({plan.instance_type}, {format_usd(plan.hourly_usd)}/h)")
    try:
        wait_running(clients, instance_id, plan.region, pacing, progress)
        wait_ssm_online(clients, instance_id, plan.region, pacing, progress)
        deployment = describe(clients.ec2, plan.region, instance_id)
        wait_bootstrap(clients.ssm, clients.s3, deployment, pacing, progress)
        return deployment
    except (KeyboardInterrupt, NeuronSSPError) as exc:
        raise _abandon(instance_id, _as_problem(exc, plan), plan, clients) from None
    except Exception:
        _abandon(instance_id, [], plan, clients)  # a bug of ours: still never leave the instance behind
        raise


def wait_running(clients: AwsClients, instance_id: str, region: str, pacing: Pacing, progress: Progress) -> None:
    def check() -> tuple[bool, str]:
        try:
            instance = clients.ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]
        except translatable() as exc:
            if error_code(exc) == "InvalidInstanceID.NotFound":  # right after launch: EC2 is eventually consistent
                return False, "not visible yet"
            raise translate(exc, "ec2", region=region) from None
        state = instance["State"]["Name"]
        if state in ("shutting-down", "terminated", "stopping", "stopped"):
            reason = instance.get("StateReason", {}).get("Message", "no reason given")
            raise RuntimeProblem(
                Problem(
                    "instance",
                    instance_id,
                    f"went to '{state}' while starting: {reason}",
                    "read the reason; for capacity errors try another AZ or a Capacity Block",
                )
            )
        return state == "running", state

    wait_until(
        f"{instance_id} running",
        check,
        timeout_s=pacing.running_timeout_s,
        pacing=pacing,
        progress=progress,
        fix="look at the instance in the EC2 console; retry in another AZ",
    )


def wait_ssm_online(clients: AwsClients, instance_id: str, region: str, pacing: Pacing, progress: Progress) -> None:
    def check() -> tuple[bool, str]:
        status = ssm_ping_status(clients.ssm, instance_id, region)
        return status == "Online", status

    wait_until(
        f"{instance_id} online in SSM",
        check,
        timeout_s=pacing.ssm_online_timeout_s,
        pacing=pacing,
        progress=progress,
        fix="the instance role needs AmazonSSMManagedInstanceCore (see deploy/README.md) "
        "and the subnet needs a route to the SSM endpoints (internet/NAT or VPC endpoints)",
    )


# Seconds to wait before each client-token lookup: EC2 is eventually consistent, and the network
# that just failed the RunInstances call may fail the first lookups too.
CLIENT_TOKEN_BACKOFF_S = (0.0, 2.0, 4.0, 8.0)


def find_by_client_token(plan: LaunchPlan, clients: AwsClients, pacing: Pacing) -> str | Problem:
    """After an interrupted RunInstances: the id of the instance AWS created, or what to tell the user.

    Every lookup of CLIENT_TOKEN_BACKOFF_S runs unless one finds the instance. "No instance found" is
    said only when a lookup succeeded; when all of them failed we say we could not check, and what to run.
    """
    token_filter = [{"Name": "client-token", "Values": [plan.client_token]}]
    failure: str | None = None
    checked = 0
    for delay in CLIENT_TOKEN_BACKOFF_S:
        try:
            pacing.sleep(delay)
            with aws_errors("ec2", region=plan.region):
                reservations = clients.ec2.describe_instances(Filters=token_filter)["Reservations"]
        except NeuronSSPError as exc:
            failure = exc.problems[0].rule
            continue
        except KeyboardInterrupt:
            failure = "interrupted again (Ctrl-C) while checking"
            break
        checked += 1
        live = [
            i["InstanceId"]
            for r in reservations
            for i in r["Instances"]
            if i["State"]["Name"] not in ("shutting-down", "terminated")
        ]
        if live:
            return live[0]
    if checked:
        return Problem(
            "instance",
            None,
            f"no instance with client token {plan.client_token} was found ({checked} lookups)",
            f"double-check with `neuron-ssp deploy list --region {plan.region}`",
        )
    return Problem(
        "instance",
        plan.client_token,
        f"could not check whether AWS created an instance before the interruption (the lookup failed: {failure})",
        f"check now: aws ec2 describe-instances --region {plan.region} "
        f"--filters Name=client-token,Values={plan.client_token} "
        "--query 'Reservations[].Instances[].[InstanceId,State.Name]'; terminate what it lists with "
        f"aws ec2 terminate-instances --region {plan.region} --instance-ids <id>",
    )


def _as_problem(exc: BaseException, plan: LaunchPlan) -> list[Problem]:
    if isinstance(exc, NeuronSSPError):
        return exc.problems
    return [
        Problem(
            "launch",
            "Ctrl-C",
            "interrupted before the instance was ready",
            f"launch again when ready (`neuron-ssp deploy launch ... --name {plan.name}`)",
        )
    ]


def _abandon(instance_id: str, cause: list[Problem], plan: LaunchPlan, clients: AwsClients) -> RuntimeProblem:
    """After a failure with an instance alive: terminate it, or (keep_on_failure) say what keeps costing."""
    costing = f"{plan.instance_type} in {plan.region} at {format_usd(plan.hourly_usd)}/h"
    if plan.keep_on_failure:
        return RuntimeProblem(
            [
                *cause,
                Problem(
                    "instance",
                    instance_id,
                    f"kept after the failure and still running: {costing}; it terminates itself "
                    f"{FAILURE_SHUTDOWN_MINUTES} min after a failed bootstrap ('sudo shutdown -c' on it keeps it) "
                    f"and at the latest at {plan.expires_at:%Y-%m-%d %H:%M} UTC, its expiry "
                    f"(`neuron-ssp deploy extend {plan.name} --hours N` moves it)",
                    f"inspect it, then `neuron-ssp deploy teardown {plan.name} --region {plan.region}`",
                ),
            ]
        )
    try:
        with aws_errors("ec2", region=plan.region):
            clients.ec2.terminate_instances(InstanceIds=[instance_id])
    except (NeuronSSPError, KeyboardInterrupt):
        return RuntimeProblem(
            [
                *cause,
                Problem(
                    "instance",
                    instance_id,
                    f"could NOT be terminated and is still running: {costing}",
                    f"terminate it now: aws ec2 terminate-instances --region {plan.region} "
                    f"--instance-ids {instance_id}",
                ),
            ]
        )
    return RuntimeProblem(
        [
            *cause,
            Problem(
                "instance",
                instance_id,
                "terminated because the launch did not finish (nothing is left running)",
                "fix the cause above and launch again; --keep-on-failure keeps the instance for debugging",
            ),
        ]
    )
