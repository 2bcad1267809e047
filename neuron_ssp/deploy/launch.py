"""Launch one instance for one config: plan (read-only), dry-run or execute, and clean up on failure.

`plan_launch` validates everything and makes only read calls, so a bad config or flag costs nothing.
`execute_launch` creates the instance and waits for the bootstrap's own verdict (ready or failed);
if anything fails after that (timeout, a failed bootstrap, Ctrl-C, an AWS error) it terminates the
instance, or with keep_on_failure says exactly what is still running and costing.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import yaml

from neuron_ssp.config import EMBEDDED_PREFIX, Config
from neuron_ssp.deploy import tags
from neuron_ssp.deploy.ami import Ami, resolve_ami
from neuron_ssp.deploy.aws import AwsClients
from neuron_ssp.deploy.bootstrap_wait import wait_bootstrap
from neuron_ssp.deploy.capacity import (
    CapacityTarget,
    Reservation,
    check_reservation,
    describe_reservation,
    run_instances_fields,
)
from neuron_ssp.deploy.errors import AwsUnreachable, aws_errors, error_code, translatable, translate
from neuron_ssp.deploy.inventory import Deployment, describe, format_usd, list_deployments
from neuron_ssp.deploy.progress import Progress
from neuron_ssp.deploy.ssm_run import ssm_ping_status
from neuron_ssp.deploy.userdata import FAILURE_SHUTDOWN_MINUTES, BootstrapSpec, HfTokenSource, render
from neuron_ssp.deploy.waiting import Pacing, wait_until
from neuron_ssp.errors import NeuronSSPError, Problem, RuntimeProblem, UsageError
from neuron_ssp.topology import hourly_price_usd


@dataclass(frozen=True)
class LaunchOptions:
    region: str
    name: str | None = None
    ami: str = "pinned"
    subnet_id: str | None = None
    security_group_ids: tuple[str, ...] = ()
    key_name: str | None = None
    instance_profile: str | None = None
    capacity: CapacityTarget | None = None
    ttl_hours: float = 4.0
    volume_gb: int = 512
    kms_key: str | None = None
    weights_s3_uri: str | None = None
    output_s3_uri: str | None = None
    package_spec: str | None = None
    hf_token: HfTokenSource | None = None
    keep_on_failure: bool = False


@dataclass(frozen=True)
class LaunchPlan:
    """Everything decided before money is spent; `params` is the exact run_instances request."""

    name: str
    config_name: str
    instance_type: str
    region: str
    ami: Ami
    hourly_usd: float | None
    ttl_hours: float
    expires_at: datetime
    params: dict[str, Any]
    warnings: tuple[str, ...]
    keep_on_failure: bool
    reservation: Reservation | None = None

    @property
    def client_token(self) -> str:
        return self.params["ClientToken"]

    @property
    def in_capacity_block(self) -> bool:
        return self.reservation is not None and self.reservation.is_block

    @property
    def max_cost_usd(self) -> float | None:
        """Worst-case instance charge of this launch; None when unknown or prepaid (a Capacity Block)."""
        if self.hourly_usd is None or self.in_capacity_block:
            return None
        return self.hourly_usd * self.ttl_hours


@dataclass(frozen=True)
class PermissionCheck:
    action: str
    allowed: bool
    detail: str


# ---------------------------------------------------------------- plan (read-only)


def plan_launch(
    config: Config,
    config_path: str | Path,
    options: LaunchOptions,
    clients: AwsClients,
    *,
    now: datetime | None = None,
    client_token: str | None = None,
) -> LaunchPlan:
    """Validate config and flags, resolve the AMI and the reservation; create nothing."""
    instance_type, config_warnings = _check_config(config)
    _check_options(options, instance_type)
    now = now or datetime.now(timezone.utc)
    expires_at = now + timedelta(hours=options.ttl_hours)
    name = tags.check_deployment_name(options.name or default_name(config, config_path))
    region = clients.region
    warnings = list(config_warnings)

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
    ami = resolve_ami(options.ami, clients.ec2, clients.ssm, region)
    if options.ami == "latest":
        warnings.append("--ami latest follows the newest Neuron SDK, which may no longer ship transformers-neuronx")

    params = _base_params(options, instance_type, ami, client_token or f"neuron-ssp-{uuid.uuid4().hex}")
    reservation = None
    if options.capacity:
        reservation = describe_reservation(clients.ec2, options.capacity, region)
        warnings += check_reservation(reservation, options.capacity, instance_type, expires_at)
        params.update(run_instances_fields(options.capacity, reservation, options.subnet_id))
    with aws_errors("sts", region=region):
        owner = clients.sts.get_caller_identity()["Arn"]
    instance_tags = tags.launch_tags(
        deployment=name,
        config_name=config_name(config, config_path),
        owner=owner,
        ttl_hours=options.ttl_hours,
        expires_at=expires_at,
        output_s3_uri=options.output_s3_uri,
    )
    params["TagSpecifications"] = tags.tag_specifications(instance_tags)
    params["UserData"] = render(
        BootstrapSpec(
            deployment=name,
            region=region,
            config_yaml=yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False),
            model_paths=model_paths(config),
            ttl_hours=options.ttl_hours,
            package_spec=options.package_spec or default_package_spec(),
            weights_s3_uri=options.weights_s3_uri,
            hf_token=options.hf_token,
        )
    )
    if not options.instance_profile:
        warnings.append(
            "no --instance-profile: SSM reaches the instance only if the account has Default Host "
            "Management Configuration; launch waits for SSM"
        )
    if not options.weights_s3_uri:
        warnings.append(f"no --weights-s3-uri: the AMI must already hold {', '.join(model_paths(config))}")
    return LaunchPlan(
        name,
        config_name(config, config_path),
        instance_type,
        region,
        ami,
        hourly_price_usd(instance_type),
        options.ttl_hours,
        expires_at,
        params,
        tuple(warnings),
        options.keep_on_failure,
        reservation,
    )


def default_name(config: Config, config_path: str | Path) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", config_name(config, config_path).lower()).strip("-")[:63] or "neuron-ssp"


def config_name(config: Config, config_path: str | Path) -> str:
    return config.name if config.name != "default" else Path(config_path).stem


def model_paths(config: Config) -> tuple[str, ...]:
    models = [config.target] + ([config.draft] if config.draft and config.speculation.drafter == "model" else [])
    return tuple(m.path for m in models if not m.path.startswith(EMBEDDED_PREFIX))


def default_package_spec() -> str:
    try:
        return f"neuron-ssp=={version('neuron-ssp')}"
    except PackageNotFoundError:
        return "neuron-ssp"


# Root volume: Neuron's setup guides ("when launching a Trn1, adjust your primary EBS volume size to a
# minimum of 512GB"). gp3's baseline of 125 MiB/s would make the ~150 GB weight sync take 20 min;
# 1000 MiB/s needs >= 4000 IOPS (gp3 allows 0.25 MiB/s per IOPS).
MIN_ROOT_VOLUME_GB = {"trn1": 512, "trn1n": 512, "trn2": 512}
ROOT_VOLUME_THROUGHPUT_MIBS = 1000
ROOT_VOLUME_IOPS = 4000
_KMS_KEY = re.compile(  # key id, multi-Region key id, alias, or the ARN of a key or an alias
    r"^(arn:aws[a-z-]*:kms:[a-z0-9-]+:\d{12}:(key|alias)/[\w/-]+|alias/[\w/-]+|[0-9a-f-]{36}|mrk-[0-9a-f]{32})$"
)


def min_root_volume_gb(instance_type: str) -> int:
    return MIN_ROOT_VOLUME_GB.get(instance_type.split(".")[0], 100)


def root_volume(options: LaunchOptions, device_name: str) -> dict[str, Any]:
    """The root EBS volume: encrypted (with --kms-key, or the account's default EBS key), deleted with the instance."""
    ebs: dict[str, Any] = {
        "VolumeSize": options.volume_gb,
        "VolumeType": "gp3",
        "Iops": ROOT_VOLUME_IOPS,
        "Throughput": ROOT_VOLUME_THROUGHPUT_MIBS,
        "Encrypted": True,
        "DeleteOnTermination": True,
    }
    if options.kms_key:
        ebs["KmsKeyId"] = options.kms_key
    return {"DeviceName": device_name, "Ebs": ebs}


def _check_options(options: LaunchOptions, instance_type: str) -> None:
    problems = []
    if not 0 < options.ttl_hours <= 168:
        problems.append(
            Problem(
                "--ttl-hours",
                options.ttl_hours,
                "must be > 0 and at most 168 (one week)",
                "pick the hours you need; the instance terminates itself after them",
            )
        )
    minimum = min_root_volume_gb(instance_type)
    if options.volume_gb < minimum:
        problems.append(
            Problem(
                "--volume-gb",
                options.volume_gb,
                f"must be >= {minimum} on {instance_type}",
                "Neuron's setup guide asks for at least 512 GB on Trn instances; Llama-2-70B + 7B in bf16 need "
                f"~150 GB of weights plus compiled artifacts; keep the default {LaunchOptions.volume_gb}",
            )
        )
    if options.kms_key is not None and not _KMS_KEY.match(options.kms_key):
        problems.append(
            Problem(
                "--kms-key",
                options.kms_key,
                "not a KMS key id, key ARN, alias or alias ARN",
                "pass e.g. alias/my-ebs-key or arn:aws:kms:us-east-1:123456789012:key/<key-id>; "
                "leave it out to use the account's default EBS key",
            )
        )
    for flag, uri in (
        ("--weights-s3-uri", options.weights_s3_uri),
        ("--output-s3-uri", options.output_s3_uri),
    ):
        if uri and not re.match(r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/.*)?$", uri):
            problems.append(Problem(flag, uri, "not an s3://bucket/prefix URI", "write it as s3://my-bucket/models"))
        elif uri and not options.instance_profile:
            problems.append(
                Problem(
                    flag,
                    uri,
                    "the instance reads/writes S3 with its instance role",
                    "pass --instance-profile with a role that has deploy/iam/instance-role-policy.json",
                )
            )
    if problems:
        raise UsageError(problems)


def _check_config(config: Config) -> tuple[str, list[str]]:
    """Deploy needs a Neuron config with an instance type, valid for that instance's topology."""
    from neuron_ssp.topology import validate_config

    if config.platform.backend != "neuron" or not config.platform.instance_type:
        raise UsageError(
            Problem(
                "platform",
                config.platform.model_dump(),
                "deploy launches Neuron configs only",
                "set platform.backend: neuron and platform.instance_type (e.g. trn1.32xlarge)",
            )
        )
    report = validate_config(config)
    report.raise_if_invalid()
    return config.platform.instance_type, [str(w) for w in report.warnings]


def _base_params(options: LaunchOptions, instance_type: str, ami: Ami, client_token: str) -> dict[str, Any]:
    params: dict[str, Any] = {
        "ImageId": ami.image_id,
        "InstanceType": instance_type,
        "MinCount": 1,
        "MaxCount": 1,
        "ClientToken": client_token,
        "InstanceInitiatedShutdownBehavior": "terminate",
        "BlockDeviceMappings": [root_volume(options, ami.root_device)],
        "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled"},
    }
    if options.subnet_id:
        params["SubnetId"] = options.subnet_id
    if options.security_group_ids:
        params["SecurityGroupIds"] = list(options.security_group_ids)
    if options.key_name:
        params["KeyName"] = options.key_name
    if options.instance_profile:
        key = "Arn" if options.instance_profile.startswith("arn:") else "Name"
        params["IamInstanceProfile"] = {key: options.instance_profile}
    return params


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
                    f"kept after the failure and still running: {costing}; it terminates itself at "
                    f"{plan.expires_at:%Y-%m-%d %H:%M} UTC if its bootstrap started, or "
                    f"{FAILURE_SHUTDOWN_MINUTES} min after a failed bootstrap ('sudo shutdown -c' on it keeps it)",
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
