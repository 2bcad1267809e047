"""`neuron-ssp deploy ...`: launch, run on, inspect and tear down inf2/trn1 instances (boto3, lazily).

Everything here is presentation: plans, tables, prompts. The AWS work lives in `neuron_ssp.deploy`.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone

import click
from rich.table import Table

from neuron_ssp.cli.aws_options import ConsoleProgress, consoles, print_record, region_option
from neuron_ssp.config import load_config
from neuron_ssp.deploy import expiry
from neuron_ssp.deploy.aws import AwsClients
from neuron_ssp.deploy.bootstrap_wait import STATUS_SNIPPET
from neuron_ssp.deploy.capacity import CapacityTarget
from neuron_ssp.deploy.errors import OPERATOR_POLICY, aws_errors
from neuron_ssp.deploy.inventory import Deployment, find_deployment, format_usd, list_deployments
from neuron_ssp.deploy.launch import check_permissions, execute_launch, prepare_launch
from neuron_ssp.deploy.launch_plan import LaunchOptions, LaunchPlan
from neuron_ssp.deploy.ssm_run import (
    NOT_READY_EXIT,
    S3Location,
    bash_commands,
    run_remote,
    run_snippet,
    ssm_ping_status,
)
from neuron_ssp.deploy.teardown import terminate
from neuron_ssp.deploy.userdata import CONFIG_FILE, LOG_FILE, HfTokenSource
from neuron_ssp.deploy.waiting import Pacing
from neuron_ssp.errors import Problem, RuntimeProblem, UsageError

PACING = Pacing()  # tests replace this with a no-sleep pacing


@click.group("deploy")
def deploy() -> None:
    """Launch neuron-ssp on inf2.48xlarge / trn1.32xlarge, run commands there, tear it down.

    These commands create real AWS resources that cost money (trn1.32xlarge ~ $21.50/h, inf2.48xlarge
    ~ $12.98/h on demand). Every instance carries a TTL and terminates itself after it. Needs the
    deploy extra: pip install 'neuron-ssp[deploy]'. See deploy/README.md.
    """


# ---------------------------------------------------------------- launch


@deploy.command("launch")
@click.argument("config_path", metavar="CONFIG", type=click.Path(dir_okay=False))
@region_option
@click.option("--name", help="Deployment name (default: from the config). Used by run/status/teardown.")
@click.option(
    "--ami",
    default="pinned",
    show_default=True,
    help="'pinned' (the Neuron DLAMI of SDK 2.25, the last with transformers-neuronx), 'latest', or ami-...",
)
@click.option("--subnet-id", help="Subnet (picks the Availability Zone). Default: the default VPC.")
@click.option("--security-group-id", "security_group_ids", multiple=True, help="Repeatable.")
@click.option("--key-name", help="EC2 key pair for SSH (not needed: commands go through SSM).")
@click.option(
    "--instance-profile",
    help="Instance profile name or ARN (role: deploy/iam/instance-role-policy.json + AmazonSSMManagedInstanceCore).",
)
@click.option("--capacity-reservation-id", help="Launch into this On-Demand Capacity Reservation (cr-...).")
@click.option("--capacity-block-id", help="Launch into this Capacity Block (cr-...), market type capacity-block.")
@click.option(
    "--ttl-hours",
    type=float,
    default=4.0,
    show_default=True,
    help="The instance shuts itself down (= terminates) after this many hours, reboots included "
    "(`deploy extend` moves it).",
)
@click.option(
    "--volume-gb",
    type=int,
    default=LaunchOptions.volume_gb,
    show_default=True,
    help="Root volume size (gp3, encrypted; trn1 needs >= 512).",
)
@click.option("--kms-key", help="KMS key (id, ARN or alias) for the root volume (default: the account's EBS key).")
@click.option(
    "--weights-s3-uri",
    help="s3://bucket/prefix holding one folder per model (named like the last part of the config's model path).",
)
@click.option("--output-s3-uri", help="s3://bucket/prefix where `deploy run` output goes (stored as a tag).")
@click.option(
    "--package-spec",
    help="What to pip install on the instance (default: neuron-ssp==<this "
    "version>; may be an s3:// wheel or a git+https URL).",
)
@click.option("--hf-token-secret", help="Secrets Manager secret id holding a Hugging Face token.")
@click.option("--hf-token-parameter", help="SSM SecureString parameter name holding a Hugging Face token.")
@click.option("--dry-run", is_flag=True, help="Check permissions with EC2 DryRun; create nothing.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.option("--keep-on-failure", is_flag=True, help="Keep the instance if the launch fails half-way.")
def launch(
    config_path: str,
    region: str | None,
    name: str | None,
    ami: str,
    subnet_id: str | None,
    security_group_ids: tuple[str, ...],
    key_name: str | None,
    instance_profile: str | None,
    capacity_reservation_id: str | None,
    capacity_block_id: str | None,
    ttl_hours: float,
    volume_gb: int,
    kms_key: str | None,
    weights_s3_uri: str | None,
    output_s3_uri: str | None,
    package_spec: str | None,
    hf_token_secret: str | None,
    hf_token_parameter: str | None,
    dry_run: bool,
    yes: bool,
    keep_on_failure: bool,
) -> None:
    """Validate CONFIG, then launch one instance for it and wait until its bootstrap is ready."""
    out, err = consoles()
    config = load_config(config_path)
    clients = AwsClients.for_region(region)
    options = LaunchOptions(
        region=clients.region,
        name=name,
        ami=ami,
        subnet_id=subnet_id,
        security_group_ids=security_group_ids,
        key_name=key_name,
        instance_profile=instance_profile,
        capacity=_capacity(capacity_reservation_id, capacity_block_id),
        ttl_hours=ttl_hours,
        volume_gb=volume_gb,
        kms_key=kms_key,
        weights_s3_uri=weights_s3_uri,
        output_s3_uri=output_s3_uri,
        package_spec=package_spec,
        hf_token=_hf_token(hf_token_secret, hf_token_parameter),
        keep_on_failure=keep_on_failure,
    )
    plan = prepare_launch(config, config_path, options, clients)
    out.print(_plan_table(plan))
    for warning in plan.warnings:
        err.print(f"[yellow]warning:[/yellow] {warning}")
    if dry_run:
        check = check_permissions(plan, clients)
        if not check.allowed:
            raise RuntimeProblem(
                Problem(
                    "permissions",
                    check.action,
                    f"the dry run was refused: {check.detail}",
                    f"attach {OPERATOR_POLICY} to your identity, then retry",
                )
            )
        out.print(
            f"[green]dry run: {check.action} allowed[/green] ({check.detail}); nothing was created. "
            "(SSM and S3 permissions are not covered by EC2 DryRun.)"
        )
        return
    if not yes and not click.confirm(confirm_question(plan), default=False, err=True):
        err.print("cancelled; nothing was created")
        return
    deployment = execute_launch(plan, clients, pacing=PACING, progress=ConsoleProgress(err))
    out.print(
        f"[green]running:[/green] {deployment.name} = {deployment.instance_id} ({deployment.instance_type}, "
        f"{deployment.availability_zone}, {format_usd(deployment.hourly_usd)}/h, "
        f"terminates itself at {plan.expires_at:%Y-%m-%d %H:%M} UTC)"
    )
    check = "curl -s localhost:8000/v1/models" if plan.serves else f"neuron-ssp bench --config {CONFIG_FILE}"
    out.print(
        f"next:  neuron-ssp deploy run {deployment.name} --region {clients.region} -- {check}\n"
        f"       neuron-ssp deploy teardown {deployment.name} --region {clients.region}"
    )


def confirm_question(plan: LaunchPlan) -> str:
    """The last question before money is spent: what it costs, in the terms it is billed."""
    if plan.in_capacity_block:
        return (
            f"Launch {plan.instance_type} into {_capacity_text(plan)} for up to {plan.ttl_hours:g} h? "
            f"Price: {CAPACITY_BLOCK_PRICE}"
        )
    return (
        f"Launch {plan.instance_type} at {format_usd(plan.hourly_usd)}/h for up to {plan.ttl_hours:g} h "
        f"(at most {format_usd(plan.max_cost_usd)})?"
    )


# EC2 returns a block's upfront fee only with the offering (DescribeCapacityBlockOfferings), not once bought.
CAPACITY_BLOCK_PRICE = (
    "the Capacity Block's upfront fee, paid when it was bought (see the offering or your bill); "
    "instances in it add no hourly instance charge, only EBS"
)


def _capacity(reservation_id: str | None, block_id: str | None) -> CapacityTarget | None:
    if reservation_id and block_id:
        raise UsageError(
            Problem(
                "--capacity-block-id",
                block_id,
                "give either a Capacity Reservation or a Capacity Block, not both",
                "drop one of the two flags",
            )
        )
    if block_id:
        return CapacityTarget(block_id, is_block=True)
    return CapacityTarget(reservation_id, is_block=False) if reservation_id else None


def _hf_token(secret: str | None, parameter: str | None) -> HfTokenSource | None:
    if secret and parameter:
        raise UsageError(
            Problem(
                "--hf-token-parameter",
                parameter,
                "give the token in one place only",
                "drop --hf-token-secret or --hf-token-parameter",
            )
        )
    if secret:
        return HfTokenSource("secretsmanager", secret)
    return HfTokenSource("ssm", parameter) if parameter else None


def _plan_table(plan: LaunchPlan) -> Table:
    table = Table(title=f"launch plan: {plan.name}", show_header=False)
    rows = [
        ("config", plan.config_name),
        ("region", plan.region),
        ("instance type", plan.instance_type),
        ("AMI", f"{plan.ami.image_id}  {plan.ami.name}  ({plan.ami.source})"),
        ("Neuron software", plan.software),
        ("price", _price_text(plan)),
        ("TTL", _ttl_text(plan)),
        ("capacity", _capacity_text(plan)),
        ("subnet", plan.params.get("SubnetId", "default VPC")),
        ("instance profile", next(iter(plan.params.get("IamInstanceProfile", {"-": "none"}).values()))),
        ("root volume", _volume_text(plan.params["BlockDeviceMappings"][0]["Ebs"])),
    ]
    if plan.serves:
        rows.append(("serves at boot", f"neuron-ssp serve, which runs: {plan.serves}"))
    for key, value in rows:
        table.add_row(key, str(value))
    return table


def _price_text(plan: LaunchPlan) -> str:
    return CAPACITY_BLOCK_PRICE if plan.in_capacity_block else f"{format_usd(plan.hourly_usd)}/h on demand (estimate)"


def _ttl_text(plan: LaunchPlan) -> str:
    text = f"{plan.ttl_hours:g} h, terminates at {plan.expires_at:%Y-%m-%d %H:%M} UTC"
    reclaim_at = plan.reservation.reclaim_at if plan.reservation else None
    if reclaim_at is not None and reclaim_at < plan.expires_at:
        text += f" (the Capacity Block's instances are terminated from {reclaim_at:%Y-%m-%d %H:%M} UTC)"
    return text if plan.max_cost_usd is None else f"{text}; at most {format_usd(plan.max_cost_usd)}"


def _volume_text(ebs: dict[str, object]) -> str:
    key = f", KMS key {ebs['KmsKeyId']}" if "KmsKeyId" in ebs else ", the account's default EBS key"
    return f"{ebs['VolumeSize']} GB gp3, {ebs['Throughput']} MiB/s, {ebs['Iops']} IOPS, encrypted{key}"


def _capacity_text(plan: LaunchPlan) -> str:
    target = plan.params.get("CapacityReservationSpecification", {}).get("CapacityReservationTarget")
    if not target:
        return "on demand"
    kind = "Capacity Block" if "InstanceMarketOptions" in plan.params else "Capacity Reservation"
    return f"{kind} {target['CapacityReservationId']}"


# ---------------------------------------------------------------- run / status / logs


@deploy.command("run")
@click.argument("name")
@click.argument("argv", nargs=-1, required=True, type=click.UNPROCESSED)
@region_option
@click.option("--output-s3-uri", help="s3://bucket/prefix for the output (default: the one given at launch).")
@click.option(
    "--timeout-minutes",
    type=click.IntRange(1, 2880),
    default=120,
    show_default=True,
    help="How long the command may run on the instance.",
)
def run(name: str, argv: tuple[str, ...], region: str | None, output_s3_uri: str | None, timeout_minutes: int) -> None:
    """Run a command on deployment NAME via SSM and print its full output.

    Put the command after `--`, e.g.  deploy run NAME -- neuron-ssp bench --config /opt/neuron-ssp/config.yaml
    """
    _, err = consoles()
    clients = AwsClients.for_region(region)
    deployment = find_deployment(clients.ec2, clients.region, name)
    uri = output_s3_uri or deployment.output_s3_uri
    if not uri:
        raise UsageError(
            Problem(
                "--output-s3-uri",
                None,
                "run output goes to S3 (SSM keeps only 24,000 characters inline)",
                "pass --output-s3-uri s3://bucket/prefix (the instance role "
                "needs s3:PutObject there) or give it at launch",
            )
        )
    try:
        result = run_remote(
            clients.ssm,
            clients.s3,
            deployment,
            bash_commands(list(argv)),
            output=S3Location.parse(uri),
            timeout_s=timeout_minutes * 60,
            pacing=PACING,
            progress=ConsoleProgress(err),
            what="run",
        )
    except KeyboardInterrupt:
        raise RuntimeProblem(
            Problem(
                "run",
                " ".join(argv),
                "stopped waiting; the command keeps running remotely",
                f"cancel it with `aws ssm cancel-command`, or see it later in {uri}",
            )
        ) from None
    click.echo(result.stdout, nl=False)
    click.echo(result.stderr, nl=False, err=True)
    if result.status != "Success":
        fix = (
            f"wait for the bootstrap: neuron-ssp deploy status {name}"
            if result.exit_code == NOT_READY_EXIT
            else f"read the output above; the bootstrap log: neuron-ssp deploy logs {name}"
        )
        raise RuntimeProblem(
            Problem(
                "remote command",
                " ".join(argv),
                f"ended {result.status} with exit code {result.exit_code}",
                fix,
            )
        )


@deploy.command("status")
@click.argument("name")
@region_option
@click.option("--json", "as_json", is_flag=True)
def status(name: str, region: str | None, as_json: bool) -> None:
    """State, uptime, cost so far, SSM reachability and bootstrap progress of NAME."""
    out, err = consoles()
    clients = AwsClients.for_region(region)
    deployment = find_deployment(clients.ec2, clients.region, name)
    info = deployment.to_dict(_now())
    info["ssm"] = (
        ssm_ping_status(clients.ssm, deployment.instance_id, clients.region) if deployment.state == "running" else "-"
    )
    online = info["ssm"] == "Online"
    info["bootstrap"] = _bootstrap_state(clients, deployment, ConsoleProgress(err)) if online else "unknown"
    print_record(out, f"deployment {name}", info, as_json)


def _bootstrap_state(clients: AwsClients, deployment: Deployment, progress: ConsoleProgress) -> str:
    result = run_snippet(
        clients.ssm,
        clients.s3,
        deployment,
        STATUS_SNIPPET,
        output=None,
        pacing=PACING,
        progress=progress,
        what="status",
    )
    return result.stdout.strip() or result.status


@deploy.command("logs")
@click.argument("name")
@region_option
@click.option("--lines", type=int, default=200, show_default=True)
@click.option(
    "--console",
    "from_console",
    is_flag=True,
    help="The EC2 console output instead (works before SSM is up).",
)
def logs(name: str, region: str | None, lines: int, from_console: bool) -> None:
    """The bootstrap log of NAME (via SSM), or the EC2 console output."""
    _, err = consoles()
    clients = AwsClients.for_region(region)
    deployment = find_deployment(clients.ec2, clients.region, name)
    if from_console:
        with aws_errors("ec2", region=clients.region):
            text = clients.ec2.get_console_output(InstanceId=deployment.instance_id, Latest=True).get("Output", "")
        click.echo("\n".join(text.splitlines()[-lines:]))
        return
    output = S3Location.parse(deployment.output_s3_uri) if deployment.output_s3_uri else None
    snippet = f"tail -n {int(lines)} {LOG_FILE}"
    progress = ConsoleProgress(err)
    result = run_snippet(
        clients.ssm, clients.s3, deployment, snippet, output=output, pacing=PACING, progress=progress, what="logs"
    )
    click.echo(result.stdout, nl=False)
    click.echo(result.stderr, nl=False, err=True)
    if result.truncated:
        err.print("[yellow]output cut at 24,000 characters; use --lines or launch with --output-s3-uri")


@deploy.command("extend")
@click.argument("name")
@region_option
@click.option("--hours", type=float, required=True, help="The instance now ends this many hours from now.")
def extend(name: str, region: str | None, hours: float) -> None:
    """Move NAME's expiry: it terminates itself HOURS from now instead (retags expires-at)."""
    out, _ = consoles()
    clients = AwsClients.for_region(region)
    deployment = find_deployment(clients.ec2, clients.region, name)
    expires_at = expiry.extend(clients.ec2, deployment, hours, _now())
    out.print(
        f"{name} ({deployment.instance_id}) now terminates itself at {expires_at:%Y-%m-%d %H:%M} UTC; "
        f"its expiry check reads the tag within {expiry.CHECK_INTERVAL_MINUTES} minutes"
    )


# ---------------------------------------------------------------- list / teardown


@deploy.command("list")
@region_option
@click.option("--json", "as_json", is_flag=True)
def list_(region: str | None, as_json: bool) -> None:
    """Everything this tool launched in the region (by tag), with uptime and cost so far."""
    out, _ = consoles()
    clients = AwsClients.for_region(region)
    now = _now()
    deployments = list_deployments(clients.ec2, clients.region)
    if as_json:
        click.echo(json.dumps([d.to_dict(now) for d in deployments], indent=2))
        return
    if not deployments:
        out.print(f"no neuron-ssp deployments in {clients.region}")
        return
    table = Table(
        title=f"neuron-ssp deployments in {clients.region}",  # six narrow columns: 80 characters
        caption="expires: when the TTL terminates the instance (UTC)",
    )
    table.add_column("deployment", overflow="fold", min_width=min(24, max(len(d.name) for d in deployments)))
    for column in ("instance", "up", "$/h", "so far", "expires"):
        table.add_column(column, justify="left" if column == "instance" else "right")
    for d in deployments:
        expires = d.expires_at
        overdue = expires is not None and expires < now
        table.add_row(
            f"{d.name}\n[dim]{d.instance_id}\n{d.availability_zone}[/dim]",
            f"{d.instance_type}\n{d.state}",
            f"{d.uptime_hours(now):.1f} h",
            format_usd(d.hourly_usd),
            format_usd(d.cost_so_far(now)),
            ("[red]" if overdue else "") + (expires.strftime("%m-%d\n%H:%M") if expires else "-"),
        )
    out.print(table)
    running = [d.hourly_usd or 0.0 for d in deployments if d.state in ("pending", "running")]
    out.print(f"running now: {len(running)} instance(s), {format_usd(sum(running))}/h")


@deploy.command("teardown")
@click.argument("name", required=False)
@region_option
@click.option("--all", "all_", is_flag=True, help="Every deployment of this tool in the region.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.option("--no-wait", is_flag=True, help="Return once termination has been requested.")
def teardown(name: str | None, region: str | None, all_: bool, yes: bool, no_wait: bool) -> None:
    """Terminate deployment NAME, or --all of them."""
    out, err = consoles()
    if bool(name) == all_:
        raise UsageError(
            Problem(
                "NAME",
                name,
                "give a deployment NAME or --all (one of the two)",
                "e.g. `neuron-ssp deploy teardown llama2-70b-trn1` or `... teardown --all`",
            )
        )
    clients = AwsClients.for_region(region)
    targets = list_deployments(clients.ec2, clients.region, None if all_ else name)
    if not targets and name:
        find_deployment(clients.ec2, clients.region, name)  # raises: no such deployment, names the known ones
    if not targets:
        out.print(f"nothing to tear down in {clients.region}")
        return
    now = _now()
    for d in targets:
        out.print(
            f"{d.name}: {d.instance_id} {d.instance_type} {d.state}, up {d.uptime_hours(now):.1f} h, "
            f"~{format_usd(d.cost_so_far(now))} so far"
        )
    if not yes and not click.confirm(f"Terminate {len(targets)} instance(s)?", default=False, err=True):
        err.print("cancelled; nothing was terminated")
        return
    terminate(clients.ec2, clients.region, targets, wait=not no_wait, pacing=PACING, progress=ConsoleProgress(err))
    out.print(f"[green]terminated[/green] {', '.join(d.instance_id for d in targets)}")


def _now() -> datetime:
    return datetime.now(timezone.utc)
