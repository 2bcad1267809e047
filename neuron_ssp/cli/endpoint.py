"""`neuron-ssp deploy endpoint ...`: SageMaker real-time endpoints with autoscaling.

Presentation only: plans, tables, prompts. The AWS work lives in `neuron_ssp.deploy.sagemaker`.
"""

from __future__ import annotations

import json

import click
from rich.console import Console
from rich.table import Table

from neuron_ssp.cli.aws_options import ConsoleProgress, consoles, print_record, region_option
from neuron_ssp.config import load_config
from neuron_ssp.deploy.aws import check_region
from neuron_ssp.deploy.sagemaker import cloudwatch
from neuron_ssp.deploy.sagemaker.autoscaling import ScalingMetric
from neuron_ssp.deploy.sagemaker.aws import SageMakerClients
from neuron_ssp.deploy.sagemaker.container import MODEL_MOUNT, container_config
from neuron_ssp.deploy.sagemaker.create import check_name_free, create_endpoint
from neuron_ssp.deploy.sagemaker.errors import sagemaker_errors
from neuron_ssp.deploy.sagemaker.inventory import endpoint_info, list_endpoints, now_utc
from neuron_ssp.deploy.sagemaker.invoke import invoke as invoke_endpoint
from neuron_ssp.deploy.sagemaker.invoke import request_body
from neuron_ssp.deploy.sagemaker.lmi import LMI_LIMITS, lmi_options
from neuron_ssp.deploy.sagemaker.plan import (
    EndpointOptions,
    EndpointPlan,
    Identity,
    check_endpoint,
    endpoint_name,
    plan_endpoint,
    request_seconds,
    serving_capacity,
)
from neuron_ssp.deploy.sagemaker.scale import scale as scale_endpoint
from neuron_ssp.deploy.sagemaker.teardown import delete_endpoint
from neuron_ssp.deploy.waiting import Pacing
from neuron_ssp.errors import Problem, RuntimeProblem, UsageError

PACING = Pacing(interval_s=30)  # tests replace this with a no-sleep pacing
DRY_RUN_IDENTITY = Identity("123456789012", "arn:aws:iam::123456789012:user/dry-run")


@click.group("endpoint")
def endpoint() -> None:
    """SageMaker real-time endpoints (ml.inf2.48xlarge, ml.trn1.32xlarge) with autoscaling.

    An endpoint bills for every instance from creation until it is deleted, whether or not it gets
    traffic. Two engines: neuron-ssp (our container, lossless acceptors, per-request acceptance
    metrics) or lmi (DJL LMI's transformers-neuronx speculation: greedy only). See deploy/README.md.
    """


@endpoint.command("create")
@click.argument("config_path", metavar="CONFIG", type=click.Path(dir_okay=False))
@region_option
@click.option("--name", help="Endpoint name (default: from the config). Model and endpoint config share it.")
@click.option("--engine", type=click.Choice(["neuron-ssp", "lmi"]), default="neuron-ssp", show_default=True)
@click.option("--instance-type", help="ml.inf2.48xlarge, ml.trn1.32xlarge, ... (default: ml. + the config's).")
@click.option("--instances", type=int, default=1, show_default=True, help="Instances to start with.")
@click.option("--min", "min_instances", type=int, help="Autoscaling: fewest instances (turns autoscaling on).")
@click.option("--max", "max_instances", type=int, help="Autoscaling: most instances (turns autoscaling on).")
@click.option(
    "--scaling-metric",
    type=click.Choice(["concurrency", "invocations"]),
    default="concurrency",
    show_default=True,
    help="Concurrent requests per model (high resolution) or invocations per instance.",
)
@click.option("--target-value", type=float, help="Target of the metric (default: explained in the plan).")
@click.option(
    "--model-s3", help="s3://bucket/prefix/ holding one folder per model (+ compiled/), mounted at /opt/ml/model."
)
@click.option("--role-arn", help="SageMaker execution role (deploy/iam/sagemaker-execution-role.json).")
@click.option("--image-uri", help="ECR image (default: neuron-ssp: the one `deploy image push` made; lmi: LMI 0.30.0).")
@click.option("--no-network-isolation", is_flag=True, help="Let the container reach the network (off by default).")
@click.option(
    "--kms-key",
    help="KMS key (id, ARN or alias) for the EBS volume that holds the models on ml.inf2 (default: a key SageMaker "
    "manages). Not on ml.trn1/trn1n: their models sit on local NVMe, encrypted by the instance's hardware.",
)
@click.option("--dry-run", is_flag=True, help="Validate and print the exact requests; call no AWS API.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.option("--keep-on-failure", is_flag=True, help="Keep what was created if the endpoint fails (it bills).")
def create(
    config_path: str,
    region: str | None,
    name: str | None,
    engine: str,
    instance_type: str | None,
    instances: int,
    min_instances: int | None,
    max_instances: int | None,
    scaling_metric: str,
    target_value: float | None,
    model_s3: str | None,
    role_arn: str | None,
    image_uri: str | None,
    no_network_isolation: bool,
    kms_key: str | None,
    dry_run: bool,
    yes: bool,
    keep_on_failure: bool,
) -> None:
    """Validate CONFIG, then create model, endpoint config and endpoint, wait for InService, autoscale."""
    out, err = consoles()
    config = load_config(config_path)
    options = EndpointOptions(
        name=name,
        engine=engine,
        instance_type=instance_type,
        instances=instances,  # type: ignore[arg-type]
        min_instances=min_instances,
        max_instances=max_instances,
        model_s3=model_s3,
        role_arn=role_arn,
        image_uri=image_uri,
        network_isolation=not no_network_isolation,
        scaling_metric=scaling_metric,
        target_value=target_value,
        kms_key=kms_key,
        keep_on_failure=keep_on_failure,
    )  # type: ignore[arg-type]
    checked, _ = check_endpoint(config, config_path, options)  # every problem, before any AWS call
    region = check_region(region)
    seconds = request_seconds(checked, serving_capacity(checked, options.engine).slots)
    if dry_run:
        plan = plan_endpoint(
            config, config_path, options, region=region, identity=DRY_RUN_IDENTITY, seconds_per_request=seconds
        )
        _print_plan(out, err, plan)
        requests = {
            "create_model": plan.model_request,
            "create_endpoint_config": plan.endpoint_config_request,
            "create_endpoint": plan.endpoint_request,
        }
        if plan.scaling:
            requests |= {
                "register_scalable_target": plan.scaling.register_request(),
                "put_scaling_policy": plan.scaling.policy_request(),
            }
        click.echo(json.dumps(requests, indent=2))
        out.print(
            "[green]dry run:[/green] nothing was created and no AWS API was called "
            f"(account {DRY_RUN_IDENTITY.account} stands in for yours)"
        )
        return
    clients = SageMakerClients.for_region(region)
    with sagemaker_errors("sts", region=region):
        caller = clients.sts.get_caller_identity()
    plan = plan_endpoint(
        config,
        config_path,
        options,
        region=region,
        identity=Identity(caller["Account"], caller["Arn"]),
        seconds_per_request=seconds,
    )
    check_name_free(clients, plan.name)
    _print_plan(out, err, plan)
    cost = plan.usd_per_hour(plan.max_instances)
    question = (
        f"Create endpoint {plan.name}: up to {plan.max_instances} × {plan.ml_instance_type} = "
        f"{'unknown' if cost is None else f'${cost:,.2f}'}/h, billed until you delete it?"
    )
    if not yes and not click.confirm(question, default=False, err=True):
        err.print("cancelled; nothing was created")
        return
    described = create_endpoint(plan, clients, pacing=PACING, progress=ConsoleProgress(err))
    out.print(f"[green]InService:[/green] {plan.name} ({described['EndpointArn']})")
    out.print(
        f"next:  neuron-ssp deploy endpoint invoke {plan.name} --region {region} --prompt 'Hello'\n"
        f"       neuron-ssp deploy endpoint status {plan.name} --region {region}\n"
        f"       neuron-ssp deploy endpoint delete {plan.name} --region {region}   (it bills until then)"
    )


def _print_plan(out: Console, err: Console, plan: EndpointPlan) -> None:
    table = Table(title=f"endpoint plan: {plan.name}", show_header=False)
    variant = plan.endpoint_config_request["ProductionVariants"][0]
    source = plan.model_request["PrimaryContainer"]["ModelDataSource"]["S3DataSource"]["S3Uri"]
    rows = [
        ("config", plan.config_name),
        ("region", plan.region),
        ("engine", plan.engine),
        ("image", plan.image_uri),
        ("Neuron software", plan.software),
        ("instance type", f"{plan.ml_instance_type} ({plan.ml_instance_type[3:]} in the topology catalog)"),
        (
            "instances",
            str(plan.instances)
            + (f", autoscaling {plan.scaling.min_instances}-{plan.scaling.max_instances}" if plan.scaling else ""),
        ),
        ("models", f"{source} -> {MODEL_MOUNT} (S3Prefix, uncompressed)"),
        ("requests at once", f"{plan.capacity.slots} per instance ({plan.capacity.reason})"),
        ("network isolation", "on" if plan.model_request["EnableNetworkIsolation"] else "off"),
        ("model storage", _storage_text(plan)),
        (
            "timeouts",
            f"download {variant['ModelDataDownloadTimeoutInSeconds']} s, "
            f"startup health check {variant['ContainerStartupHealthCheckTimeoutInSeconds']} s",
        ),
        (
            "price",
            f"{plan.price.amount()} per instance, at most {plan.max_instances}: "
            f"{plan.price.amount(plan.max_instances)} ({plan.price.source})",
        ),
        ("billing", "a real-time endpoint bills every instance until it is deleted, traffic or not"),
    ]
    if plan.scaling:
        rows.append(("scaling target", plan.scaling.explanation))
    if plan.serves:
        rows.append(("container runs", f"neuron-ssp serve --sagemaker, which execs: {plan.serves}"))
    for key, value in rows:
        table.add_row(key, value)
    out.print(table)
    for warning in plan.warnings:
        err.print(f"[yellow]note:[/yellow] {warning}")


def _storage_text(plan: EndpointPlan) -> str:
    volume = plan.endpoint_config_request["ProductionVariants"][0].get("VolumeSizeInGB")
    if volume is None:
        return "the instance's local NVMe (encrypted by its hardware)"
    key = plan.endpoint_config_request.get("KmsKeyId", "a key SageMaker manages")
    return f"{volume} GB EBS volume per instance (the weights + 20 % + 20 GB), encrypted with {key}"


@endpoint.command("status")
@click.argument("name")
@region_option
@click.option("--json", "as_json", is_flag=True)
def status(name: str, region: str | None, as_json: bool) -> None:
    """Status, instances (current/desired, autoscaling range), age and $/h of endpoint NAME."""
    out, _ = consoles()
    clients = SageMakerClients.for_region(region)
    print_record(out, f"endpoint {name}", endpoint_info(clients, name).to_dict(now_utc()), as_json)


@endpoint.command("invoke")
@click.argument("name")
@region_option
@click.option("--prompt", help='Text to complete (sent as {"inputs", "parameters"}).')
@click.option("--body", help='A JSON body to send as is (OpenAI chat/completions or {"inputs", ...}).')
@click.option("--max-new-tokens", type=click.IntRange(1, 8192), default=128, show_default=True)
@click.option("--stream", is_flag=True, help="invoke_endpoint_with_response_stream: print tokens as they come.")
@click.option("--json", "as_json", is_flag=True, help="Print {text, speculative} as one object.")
def invoke(
    name: str,
    region: str | None,
    prompt: str | None,
    body: str | None,
    max_new_tokens: int,
    stream: bool,
    as_json: bool,
) -> None:
    """Send a prompt to NAME; print the text and, for the neuron-ssp engine, the speculative stats."""
    out, err = consoles()
    payload = request_body(prompt, body, max_new_tokens, stream)
    clients = SageMakerClients.for_region(region)
    show = (lambda piece: None) if as_json else (lambda piece: click.echo(piece, nl=False))
    answer = invoke_endpoint(clients.runtime, name, payload, stream=stream, on_text=show, region=clients.region)
    if as_json:
        click.echo(json.dumps({"text": answer.text, "speculative": answer.speculative}, indent=2))
        return
    click.echo()
    if answer.speculative:
        stats = answer.speculative
        table = Table(title="speculative", show_header=False)
        for key, value in stats.items():
            table.add_row(str(key), json.dumps(value) if isinstance(value, (list, dict)) else str(value))
        out.print(table)
    else:
        err.print("[dim]no speculative stats in the answer (the lmi engine reports none)[/dim]")


@endpoint.command("logs")
@click.argument("name")
@region_option
@click.option("--lines", type=click.IntRange(1, 10000), default=100, show_default=True)
def logs(name: str, region: str | None, lines: int) -> None:
    """The last lines of NAME's container log (CloudWatch /aws/sagemaker/Endpoints/NAME)."""
    _, err = consoles()
    clients = SageMakerClients.for_region(region)
    found = cloudwatch.tail(clients.logs, name, lines, region=clients.region)
    if not found:
        err.print(f"no log yet in {cloudwatch.log_group(name)} (the container has not started)")
    for line in found:
        click.echo(line)


@endpoint.command("scale")
@click.argument("name")
@region_option
@click.option("--min", "min_instances", type=int, help="New autoscaling minimum.")
@click.option("--max", "max_instances", type=int, help="New autoscaling maximum.")
@click.option("--instances", type=int, help="Set the instance count now.")
@click.option(
    "--scaling-metric",
    type=click.Choice(["concurrency", "invocations"]),
    help="Track another metric (the range is kept; invocations needs --target-value).",
)
@click.option("--target-value", type=float, help="New target of the tracked metric.")
def scale(
    name: str,
    region: str | None,
    min_instances: int | None,
    max_instances: int | None,
    instances: int | None,
    scaling_metric: ScalingMetric | None,
    target_value: float | None,
) -> None:
    """Change NAME's autoscaling range (--min/--max), what it tracks (--scaling-metric, --target-value) or its
    instance count (--instances)."""
    out, _ = consoles()
    if all(v is None for v in (min_instances, max_instances, instances, scaling_metric, target_value)):
        raise UsageError(
            Problem(
                "--min/--max/--instances/--scaling-metric/--target-value",
                None,
                "nothing to change",
                "pass --min and --max, --scaling-metric and/or --target-value, or --instances",
            )
        )
    clients = SageMakerClients.for_region(region)
    info = scale_endpoint(
        clients,
        name,
        min_instances=min_instances,
        max_instances=max_instances,
        instances=instances,
        metric=scaling_metric,
        target_value=target_value,
    )
    tracking = f", tracking {info.scaling}" if info.scaling else ""
    out.print(
        f"{name}: {info.status}, {info.current_instances} instance(s) now, desired {info.desired_instances}, "
        f"autoscaling {info.min_instances}-{info.max_instances}{tracking}"
    )


@endpoint.command("list")
@region_option
@click.option("--json", "as_json", is_flag=True)
def list_(region: str | None, as_json: bool) -> None:
    """neuron-ssp endpoints in the region (by tag), with age, instances and $/h."""
    out, _ = consoles()
    clients = SageMakerClients.for_region(region)
    now = now_utc()
    found = list_endpoints(clients)
    if as_json:
        click.echo(json.dumps([e.to_dict(now) for e in found], indent=2))
        return
    if not found:
        out.print(f"no neuron-ssp endpoints in {clients.region}")
        return
    table = Table(title=f"neuron-ssp endpoints in {clients.region}")
    for column in ("name", "status", "engine", "type", "instances", "autoscaling", "age", "$/h"):
        table.add_column(column, no_wrap=True)
    for e in found:
        price = e.usd_per_hour
        table.add_row(
            e.name,
            e.status,
            e.engine,
            e.instance_type,
            str(e.current_instances),
            "off" if e.min_instances is None else f"{e.min_instances}-{e.max_instances} {e.scaling or ''}".strip(),
            f"{e.age_hours(now):.1f} h",
            "?" if price is None else f"${price:,.2f}",
        )
    out.print(table)
    total = sum(e.usd_per_hour or 0.0 for e in found)
    out.print(f"billing now: ${total:,.2f}/h (SageMaker hosting prices, us-east-1; until deleted)")


@endpoint.command("delete")
@click.argument("name")
@region_option
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
def delete(name: str, region: str | None, yes: bool) -> None:
    """Delete NAME's scaling policy, scalable target, endpoint, endpoint config and model (idempotent)."""
    out, err = consoles()
    clients = SageMakerClients.for_region(region)
    if not yes and not click.confirm(
        f"Delete endpoint {name} and its model/config in {clients.region}?", default=False, err=True
    ):
        err.print("cancelled; nothing was deleted")
        return
    left = delete_endpoint(clients, name).left
    if left:
        raise RuntimeProblem(
            Problem(
                "endpoint",
                name,
                f"could not delete: {'; '.join(left)}",
                "fix the cause (permissions?) and run delete again",
            )
        )
    out.print(f"[green]deleted[/green] {name} (whatever existed of policy, target, endpoint, config, model)")


@endpoint.command("render")
@click.argument("config_path", metavar="CONFIG", type=click.Path(dir_okay=False))
@click.option("--engine", type=click.Choice(["lmi", "neuron-ssp"]), default="lmi", show_default=True)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["properties", "env"]),
    default="properties",
    show_default=True,
    help="lmi: serving.properties, or the OPTION_* environment.",
)
@click.option("--model-root", default=MODEL_MOUNT, show_default=True, help="Where the model folders are mounted.")
@click.option("--instance-type", help="ml.* type to validate against (default: ml. + the config's).")
def render(config_path: str, engine: str, fmt: str, model_root: str, instance_type: str | None) -> None:
    """Print what the container gets for CONFIG: LMI's serving.properties / OPTION_* env, or our config."""
    config = load_config(config_path)
    options = EndpointOptions(engine=engine, instance_type=instance_type)  # type: ignore[arg-type]
    checked, _ = check_endpoint(config, config_path, options, for_create=False)
    if engine == "neuron-ssp":
        click.echo(json.dumps(container_config(checked), indent=2))
        return
    rendered = lmi_options(checked, model_root)
    if fmt == "env":
        _, err = consoles()
        for key, value in rendered.environment().items():
            click.echo(f"{key}={value}")
        for note in rendered.notes:  # on stderr: stdout stays an environment file
            err.print(f"[yellow]note:[/yellow] {note}", markup=True, highlight=False)
        return
    comment = (
        f"serving.properties for {endpoint_name(options, config, config_path)} on "
        f"ml.{checked.platform.instance_type} (neuron-ssp deploy endpoint render)\n"
        "speculative_length is the window k: the draft proposes k-1 tokens per step\n"
        + "\n".join(f"LMI limit: {limit}" for limit in LMI_LIMITS)
        + "".join(f"\nnote: {note}" for note in rendered.notes)
    )
    click.echo(rendered.serving_properties(comment), nl=False)
