"""`neuron-ssp validate` and `neuron-ssp plan`: topology checks and the memory/cost plan, no hardware.

They run before anything is compiled or rented, so they print every problem at once and say
which tp degree, core or instance to use instead.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from neuron_ssp.cli.config_show import effective_dict, effective_yaml
from neuron_ssp.config import Config, ResolvedConfig, fallback_problems, load_config, resolve_config
from neuron_ssp.deploy.vllm_neuron import command_text
from neuron_ssp.errors import UsageError
from neuron_ssp.pipeline.controls import serving_notes
from neuron_ssp.topology import (
    DeploymentPlan,
    ModelPlan,
    ValidationReport,
    plan_all_instances,
    plan_deployment,
    validate_config,
)
from neuron_ssp.topology.batch_plan import LARGEST_BATCH_SEARCHED
from neuron_ssp.topology.batch_projection import BatchProjection, plan_batch_projection
from neuron_ssp.topology.batch_rules import TNX_DEFAULT, generation_for_version
from neuron_ssp.topology.memory import gib
from neuron_ssp.topology.parallelism import KV_PADDING, KV_RULES, kv_rule_for_version
from neuron_ssp.topology.projection import DEFAULT_ALPHA, Projection, head_step_ms, project
from neuron_ssp.topology.published_runs import published_run

NEURONX_VERSION = click.option(
    "--neuronx-version",
    "neuronx_version",
    metavar="VERSION",
    help="transformers-neuronx version to plan for: 0.10 (SDK 2.18) replicates kv heads up to the query heads, "
    "0.11+ only up to tp; batch > 1 needs 0.13 (SDK 2.21+). Default: 0.13 (a Neuron host checks the installed "
    "one at load).",
)


def _batch_sizes(_ctx: click.Context, _param: click.Parameter, value: str | None) -> list[int] | None:
    if value is None:
        return None
    try:
        sizes = sorted({int(part) for part in value.split(",") if part.strip()})
    except ValueError:
        sizes = []
    if not sizes or not 1 <= sizes[0] <= sizes[-1] <= LARGEST_BATCH_SEARCHED:
        raise click.BadParameter(f"comma-separated batch sizes from 1 to {LARGEST_BATCH_SEARCHED}, e.g. 1,2,4,8")
    return sizes


@click.command("validate")
@click.argument("configs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help='One config: {"valid", "errors", "warnings", "load_order"}; several: an object '
    "mapping each path to that shape.",
)
@click.option(
    "--show",
    is_flag=True,
    help="Also print each config's effective values and where each came from (as `neuron-ssp config`; "
    'with --json under "effective").',
)
@NEURONX_VERSION
@click.pass_context
def validate(
    ctx: click.Context, configs: tuple[Path, ...], as_json: bool, show: bool, neuronx_version: str | None
) -> None:
    """Check CONFIG files against the Trn1/Inf2 rules before anything loads.

    Rules: tp degree per platform and instance, NeuronCore placement of draft and target, device
    memory per core (25 % headroom), n_positions >= the slots a generation writes (prompt + max_new_tokens
    - 1 for the target), 2 <= k <= n_positions, batch > 1, continuous batching (serve.max_batch) and sampling
    per library, engine and version (docs/neuron.md, "Batch > 1"), one vocabulary for draft and target.
    Every problem is printed with its fix; a value the file leaves out that takes the schema's default where
    the embedded default's differs (another model or backend) is a warning.
    Exit code 0 when every config is valid, 1 otherwise.
    """
    checked = {str(path): _validate_file(path, neuronx_version) for path in configs}
    if as_json:
        dicts = {
            path: {**report.to_dict(), **({"effective": effective_dict(resolved)} if show and resolved else {})}
            for path, (report, resolved) in checked.items()
        }
        click.echo(_json(next(iter(dicts.values())) if len(dicts) == 1 else dicts))
    else:
        console = Console()
        for path, (report, resolved) in checked.items():
            _print_report(console, path, report)
            if show and resolved is not None:
                click.echo(effective_yaml(resolved), nl=False)
    ctx.exit(0 if all(report.ok for report, _ in checked.values()) else 1)


@click.command("plan")
@click.argument("config_path", metavar="CONFIG", type=click.Path(path_type=Path))
@click.option("--instance", "instance_type", help="Plan on this instance type, not platform.instance_type.")
@click.option("--all-instances", is_flag=True, help="Which instances can host the models, at which tp.")
@click.option(
    "--ms-per-token",
    type=click.FloatRange(min=0, min_open=True),
    help="Generation latency for the cost per million tokens (default: the published latency "
    "of the target's plain decoding, where known; SSp divides it by its speedup).",
)
@click.option(
    "--engine",
    type=click.Choice(["native", "fused"]),
    help="Also project ms/token and speedup for this engine from published latencies, α and k.",
)
@click.option(
    "--alpha",
    type=click.FloatRange(0, 1),
    default=DEFAULT_ALPHA,
    show_default=True,
    help="Acceptance rate assumed by --engine (tune-k measures it).",
)
@click.option(
    "--draft-ms-per-token",
    type=click.FloatRange(min=0, min_open=True),
    help="The draft's plain ms/token for --engine, where none is published.",
)
@click.option(
    "--batch-sizes",
    "batches",
    callback=_batch_sizes,
    metavar="N,N,...",
    help="Batch sizes for the memory (and, with --engine, tokens/s) per batch. Default: 1, 2, 4, ... up to "
    "target.batch_size, shown when that is above 1.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
@NEURONX_VERSION
@click.pass_context
def plan(
    ctx: click.Context,
    config_path: Path,
    instance_type: str | None,
    all_instances: bool,
    ms_per_token: float | None,
    engine: str | None,
    alpha: float,
    draft_ms_per_token: float | None,
    batches: list[int] | None,
    as_json: bool,
    neuronx_version: str | None,
) -> None:
    """Device memory, NeuronCores, load order and cost of CONFIG's models on an instance, per batch size.

    Exit code 0 when the config is valid there and the models fit, 1 otherwise.
    """
    config = load_config(config_path)
    kv_rule = _kv_rule(neuronx_version)
    if all_instances:
        plans = plan_all_instances(config, ms_per_token, kv_rule)
        if as_json:
            click.echo(_json([_option_dict(p) for p in plans]))
        else:
            _print_instances(Console(), config, plans)
        ctx.exit(0 if any(_hosts(p) for p in plans) else 1)
    deployment = plan_deployment(config, instance_type, ms_per_token, kv_rule, batches=batches)
    report = validate_config(
        _on_neuron(config, deployment.instance.name), kv_rule, neuronx_generation=_generation(neuronx_version)
    )
    report.warnings.extend(serving_notes(config))  # which requests its engine refuses, and why
    estimate = _head_estimate(config, deployment)
    projection = _projection(config, deployment, engine, alpha, ms_per_token, draft_ms_per_token, estimate)
    per_batch = (
        None
        if engine is None
        else plan_batch_projection(
            config,
            deployment,
            engine,
            alpha,
            [row.batch for row in deployment.per_batch],
            ms_per_token,
            draft_ms_per_token,
            estimate,
        )
    )
    if as_json:
        extra = {}
        if projection is not None and per_batch is not None:
            extra["projection"] = {**projection.to_dict(), "per_batch": per_batch.to_dict()}
        click.echo(_json({**deployment.to_dict(), "validation": report.to_dict(), **extra}))
    else:
        console = Console()
        _print_plan(console, deployment, config)
        if len(deployment.per_batch) > 1:
            _print_batches(console, deployment)
        if projection is not None:
            _print_projection(console, projection)
        if per_batch is not None and len(per_batch.rows) > 1:
            _print_batch_projection(console, per_batch, deployment.cost_per_hour)
        if report.errors or report.warnings:
            _print_report(console, str(config_path), report)
    ctx.exit(0 if report.ok and deployment.fits else 1)


def _projection(
    config: Config,
    deployment: DeploymentPlan,
    engine: str | None,
    alpha: float,
    target_ms: float | None,
    draft_ms: float | None,
    estimate: tuple[float, str] | None,
) -> Projection | None:
    if engine is None:
        return None
    draft = deployment.models.get("draft") if config.speculation.drafter in ("model", "eagle", "eagle3") else None
    target_arch, draft_arch = deployment.models["target"].architecture.name, draft.architecture.name if draft else None
    run = published_run(deployment.instance.name, target_arch, draft_arch)
    return project(
        engine,
        config.speculation.k,
        alpha,
        deployment.instance.name,
        target_arch,
        draft_arch,
        target_ms,
        draft_ms,
        deployment.library,
        (run, run.differences(config)) if run else None,
        estimate,
    )


def _head_estimate(config: Config, deployment: DeploymentPlan) -> tuple[float, str] | None:
    """An EAGLE head's ms per step, estimated from its target's published latency (projection.head_step_ms)."""
    head = deployment.models.get("draft")
    if head is None or config.speculation.drafter not in ("eagle", "eagle3"):
        return None
    return head_step_ms(deployment.models["target"].architecture, head.architecture, deployment.instance.name)


def _kv_rule(neuronx_version: str | None) -> str:
    return kv_rule_for_version(neuronx_version) if neuronx_version else KV_PADDING


def _generation(neuronx_version: str | None) -> str:
    return generation_for_version(neuronx_version) if neuronx_version else TNX_DEFAULT


def _validate_file(path: Path, neuronx_version: str | None) -> tuple[ValidationReport, ResolvedConfig | None]:
    """The report (the loading rule's fallbacks among its warnings) and the resolved config, when it loads."""
    try:
        resolved = resolve_config(path)
    except UsageError as exc:
        return ValidationReport(errors=list(exc.problems)), None
    report = validate_config(
        resolved.config, _kv_rule(neuronx_version), neuronx_generation=_generation(neuronx_version)
    )
    report.warnings.extend(fallback_problems(resolved))
    report.warnings.extend(serving_notes(resolved.config))
    return report, resolved


def _on_neuron(config: Config, instance_type: str) -> Config:
    platform = config.platform.model_copy(update={"backend": "neuron", "instance_type": instance_type})
    return config.model_copy(update={"platform": platform})


def _hosts(deployment: DeploymentPlan) -> bool:
    return deployment.recommended_tp is not None


# ---------------------------------------------------------------- printing

ERROR, WARNING = "[red]error[/red]", "[yellow]warning[/yellow]"


def _print_report(console: Console, path: str, report: ValidationReport) -> None:
    verdict = "[green]valid[/green]" if report.ok else f"[red]invalid: {len(report.errors)} error(s)[/red]"
    warned = f", {len(report.warnings)} warning(s)" if report.warnings else ""
    console.print(f"[bold]{escape(path)}[/bold]: {verdict}{warned}")
    if report.errors or report.warnings:
        table = Table(show_header=False, show_lines=True)  # two columns: reads at 80 characters
        table.add_column(no_wrap=True)
        table.add_column()
        for kind, problems in ((ERROR, report.errors), (WARNING, report.warnings)):
            for p in problems:
                table.add_row(
                    kind,
                    f"[bold]{escape(p.field)}[/bold] = {escape(repr(p.value))}\n"
                    f"rule: {escape(p.rule)}\nfix:  {escape(p.fix)}",
                )
        console.print(table)
    if report.load_order:
        console.print(f"  load order: {' -> '.join(report.load_order)}")


def _print_plan(console: Console, deployment: DeploymentPlan, config: Config) -> None:
    """One row per quantity, one column per model: reads at 80 characters."""
    instance = deployment.instance
    console.print(
        f"[bold]plan: {deployment.config_name} on {instance.name}[/bold] ({instance.cores_text} "
        f"x {instance.hbm_per_core_gib} GiB HBM, {instance.generation}, {deployment.library})"
    )
    models = deployment.models
    table = Table("", *models)
    for column in table.columns[1:]:
        column.justify = "right"
    rows: list[tuple[str, Any]] = [
        ("architecture", lambda m: m.architecture.name),
        ("parameters", lambda m: f"{m.architecture.params / 1e9:.2f} B"),
        ("dtype", lambda m: m.dtype),
        ("tp degree (cores)", lambda m: f"{m.tp_degree} ({m.cores})"),
        ("heads query/kv", lambda m: f"{m.architecture.heads}/{m.architecture.kv_heads}"),
        ("  on device, padded", lambda m: f"{m.footprint.q_heads_on_device}/{m.footprint.kv_heads_on_device}"),
        ("weights, whole model", lambda m: f"{gib(m.footprint.weight_bytes):.1f} GiB"),
        ("KV cache, whole model", lambda m: f"{gib(m.footprint.kv_bytes):.2f} GiB"),
        ("weights per core", lambda m: f"{gib(m.footprint.weight_bytes_per_core):.2f} GiB"),
        ("KV cache per core", lambda m: f"{gib(m.footprint.kv_bytes_per_core):.2f} GiB"),
        ("total per core", lambda m: f"{gib(m.footprint.bytes_per_core):.2f} GiB"),
        ("cores needed (memory)", lambda m: f"{m.cores_needed:.1f}"),
        ("smallest tp alone", lambda m: str(m.smallest_fitting_tp or "none")),
    ]
    for name, cell in rows:
        table.add_row(name, *(cell(m) for m in models.values()))
    console.print(table)
    busiest, usable = deployment.busiest_core_bytes, deployment.usable_bytes_per_core
    if not deployment.within_instance:
        verdict = f"[red]does not fit: uses cores beyond the {instance.neuron_cores} of {instance.name}[/red]"
    elif deployment.fits:
        verdict = f"[green]fits, {gib(usable - busiest):.2f} GiB spare[/green]"
    else:
        verdict = f"[red]does not fit: {gib(busiest - usable):.2f} GiB too much[/red]"
    console.print(
        f"busiest core: {gib(busiest):.2f} GiB of {gib(usable):.2f} GiB usable "
        f"({instance.hbm_per_core_gib} GiB HBM, {deployment.headroom_fraction:.0%} kept as "
        f"headroom) -> {verdict}"
    )
    fitting = ", ".join(str(tp) for tp in deployment.fitting_tp_degrees) or f"none ({deployment.refusal})"
    console.print(f"one tp for all models that fits: {fitting}; recommended: {deployment.recommended_tp or 'none'}")
    console.print(
        f"load order: {' -> '.join(deployment.load_order)}; NEURON_RT_VISIBLE_CORES={deployment.visible_cores}"
    )
    if deployment.library == "vllm-neuron":
        console.print(
            "compiled graphs: vllm-neuron compiles its own at startup (its num_seqs and token buckets), not counted "
            "here; `neuron-ssp serve` runs: " + command_text(config),
            highlight=False,
        )
    else:
        console.print(
            f"compiled graphs, one neuronx-cc run each ({deployment.library}'s buckets; a prompt runs the "
            "smallest context bucket that holds it):"
        )
        for role, model in models.items():
            console.print(f"  {role}: {_graphs_text(model)}", highlight=False)
    console.print(_cost_line(deployment))
    kv = (
        f"kv heads replicated as {KV_RULES[deployment.kv_rule]}"
        if deployment.library == "transformers-neuronx"
        else "kv heads replicated as its GQA sharding does"
    )
    console.print(
        f"Per core counts the heads as {deployment.library} places them: query heads padded to a "
        f"multiple of tp, {kv}. Cores needed = (weights + KV cache) / usable HBM per core, before "
        "rounding up to a tp the platform accepts (smallest tp alone)."
    )


def _print_batches(console: Console, deployment: DeploymentPlan) -> None:
    """Memory per batch size: the KV cache grows with the batch, the weights do not."""
    roles = list(deployment.models)
    table = Table(
        "batch",
        *(f"{role} KV/core" for role in roles),
        "busiest core",
        "fits",
        title="per batch (KV cache x batch; weights once)",
        title_justify="left",
    )
    for column in table.columns:
        column.justify = "right"
    for row in deployment.per_batch:
        table.add_row(
            str(row.batch),
            *(f"{gib(row.kv_bytes_per_core[role]):.2f} GiB" for role in roles),
            f"{gib(row.busiest_core_bytes):.2f} GiB",
            "yes" if row.fits else "[red]no[/red]",
        )
    console.print(table)
    tp = deployment.models["target"].tp_degree
    largest = deployment.largest_fitting_batch
    console.print(
        f"largest batch that fits at tp {tp}: "
        + (f"{largest}" if largest < LARGEST_BATCH_SEARCHED else f"{largest} or more")
        + f" (of {gib(deployment.usable_bytes_per_core):.2f} GiB usable per core)",
        highlight=False,
    )


def _print_batch_projection(console: Console, projection: BatchProjection, price_per_hour: float | None) -> None:
    """`plan --engine` per batch size: all rows' tokens/s, plain and speculative, and what it assumes."""
    table = Table(
        "batch",
        "target call",
        "plain tok/s",
        "SSp tok/s",
        "speedup",
        "$/M tok",
        title=f"projection per batch: engine {projection.engine}, k={projection.k}, α={projection.alpha:g}",
        title_justify="left",
    )
    for column in table.columns:
        column.justify = "right"
    for row in projection.rows:
        million = (
            None
            if price_per_hour is None or not row.speculative_tokens_per_s
            else price_per_hour / (row.speculative_tokens_per_s * 3600) * 1e6
        )
        table.add_row(
            str(row.batch),
            _number(row.target_call_ms, " ms"),
            _number(row.plain_tokens_per_s),
            _number(row.speculative_tokens_per_s),
            _number(row.speedup, "x"),
            _number(million),
        )
    console.print(table)
    money = (
        [] if price_per_hour is None else [f"$/M tok: ${price_per_hour:.2f}/h on demand ÷ the SSp tokens/s of all rows"]
    )
    for line in (*projection.notes, *money, *(f"assumed: {a}" for a in projection.assumptions)):
        console.print(f"  {escape(line)}", highlight=False)


def _number(value: float | None, unit: str = "") -> str:
    return "-" if value is None else f"{value:.2f}{unit}" if unit else f"{value:.1f}"


def _graphs_text(model: ModelPlan) -> str:
    graphs = model.graphs
    if not graphs.total:
        return "none of its own: compiled into the target's fused graphs"
    parts = [
        f"{graphs.context} context encoding",
        f"{graphs.token} token generation",
        f"{graphs.speculation} speculation",
    ]
    kinds = " + ".join(part for part in parts if not part.startswith("0 "))
    rows = (
        ""
        if graphs.batch == 1
        else f", decoding at batch {graphs.batch}, context encoding at batch {graphs.context_batch}"
    )
    return (
        f"{graphs.total} = {kinds}; context buckets {_lengths(model.context_buckets)}, "
        f"decoding buckets {_lengths(model.decoding_buckets)}{rows}"
    )


def _lengths(buckets: list[int]) -> str:
    return ", ".join(str(b) for b in buckets)


def _print_projection(console: Console, projection: Projection) -> None:
    """`plan --engine`: the projected ms/token and speedup, each figure next to its assumption."""
    table = Table(
        title=f"projection: engine {projection.engine}, k={projection.k} (no hardware; assumptions beside each figure)",
        title_justify="left",
    )
    for column in ("figure", "value", "assumption"):
        table.add_column(column, justify="right" if column == "value" else "left")
    for figure in projection.figures:
        value = "-" if figure.value is None else f"{figure.value:.2f}{figure.unit if figure.unit == 'x' else ''}"
        value += " ms" if figure.unit == "ms" and figure.value is not None else ""
        table.add_row(figure.name, value, figure.assumption)
    console.print(table)


def _cost_line(deployment: DeploymentPlan) -> str:
    if deployment.cost_per_hour is None:
        return f"cost: no on-demand price for {deployment.instance.name}"
    line = f"cost: ${deployment.cost_per_hour:.2f}/h on demand [{escape(deployment.instance.price_source)}]"
    if deployment.cost_per_million_tokens is None:
        return f"{line}; per million tokens: {deployment.ms_per_token_source}"
    return (
        f"{line}; ${deployment.cost_per_million_tokens:.2f} per million generated tokens at "
        f"{deployment.ms_per_token:g} ms/token ({deployment.ms_per_token_source})"
    )


def _print_instances(console: Console, config: Config, plans: list[DeploymentPlan]) -> None:
    names = " + ".join(m.architecture.name for m in plans[0].models.values())
    console.print(
        f"[bold]{config.name}: which instances can host {names}[/bold] "
        f"(one tp for all models, {plans[0].headroom_fraction:.0%} of HBM kept as headroom)"
    )
    table = Table("instance", "cores", "hosts?", "tp", "GiB/core", "$/h", "$/M tok")
    for column in table.columns[1:]:
        column.justify = "right"
    table.columns[2].justify = "left"
    table.columns[0].no_wrap = True
    for p in plans:
        hosts = _hosts(p)
        table.add_row(
            p.instance.name,
            str(p.instance.neuron_cores),
            "yes" if hosts else "no",
            str(p.recommended_tp or "-"),
            f"{gib(p.busiest_core_bytes):.2f}" if hosts else "-",
            _money(p.cost_per_hour),
            _money(p.cost_per_million_tokens) if hosts else "-",
        )
    console.print(table)
    for p in plans:
        if not _hosts(p):
            console.print(f"[bold]{p.instance.name}[/bold]: no, {p.refusal}")
    for p in plans:
        if _hosts(p):
            console.print(
                f"[bold]{p.instance.name}[/bold]: tp that fit {', '.join(str(tp) for tp in p.fitting_tp_degrees)}"
            )
    console.print(
        "tp: recommended (the largest tested that fits); GiB/core: the busiest core at that tp. "
        "$/M tok: dollars per million tokens at the target's published plain-decoding latency on "
        "that platform (or --ms-per-token); '-' where none is published."
    )


def _money(amount: float | None) -> str:
    return "-" if amount is None else f"{amount:.2f}"


def _option_dict(deployment: DeploymentPlan) -> dict[str, Any]:
    return {
        "instance": deployment.instance.name,
        "neuron_cores": deployment.instance.neuron_cores,
        "hosts": "yes" if _hosts(deployment) else f"no: {deployment.refusal}",
        "refusal": deployment.refusal,
        "fitting_tp_degrees": deployment.fitting_tp_degrees,
        "recommended_tp": deployment.recommended_tp,
        "busiest_core_bytes": deployment.busiest_core_bytes,
        "cost_per_hour": deployment.cost_per_hour,
        "ms_per_token": deployment.ms_per_token,
        "cost_per_million_tokens": deployment.cost_per_million_tokens,
    }


def _json(data: Any) -> str:
    return json.dumps(data, indent=2)
