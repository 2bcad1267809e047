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
from rich.table import Table

from neuron_ssp.config import Config, load_config
from neuron_ssp.errors import UsageError
from neuron_ssp.topology import (
    DeploymentPlan,
    ValidationReport,
    plan_all_instances,
    plan_deployment,
    validate_config,
)
from neuron_ssp.topology.memory import gib


@click.command("validate")
@click.argument("configs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True,
              help='One config: {"valid", "errors", "warnings", "load_order"}; several: an object '
                   "mapping each path to that shape.")
@click.pass_context
def validate(ctx: click.Context, configs: tuple[Path, ...], as_json: bool) -> None:
    """Check CONFIG files against the Trn1/Inf2 rules before anything loads.

    Rules: tp degree per platform and instance, NeuronCore placement of draft and target, device
    memory per core (25 % headroom), n_positions >= the slots a generation writes (prompt + max_new_tokens
    - 1 for the target), 2 <= k <= n_positions,
    batch 1 on Neuron, one vocabulary for draft and target. Every problem is printed with its fix.
    Exit code 0 when every config is valid, 1 otherwise.
    """
    reports = {str(path): _validate_file(path) for path in configs}
    if as_json:
        dicts = {path: report.to_dict() for path, report in reports.items()}
        click.echo(_json(next(iter(dicts.values())) if len(dicts) == 1 else dicts))
    else:
        console = Console()
        for path, report in reports.items():
            _print_report(console, path, report)
    ctx.exit(0 if all(report.ok for report in reports.values()) else 1)


@click.command("plan")
@click.argument("config_path", metavar="CONFIG", type=click.Path(path_type=Path))
@click.option("--instance", "instance_type", help="Plan on this instance type, not platform.instance_type.")
@click.option("--all-instances", is_flag=True, help="Which instances can host the models, at which tp.")
@click.option("--ms-per-token", type=click.FloatRange(min=0, min_open=True),
              help="Generation latency for the cost per million tokens (default: the published latency "
                   "of the target's plain decoding, where known; SSp divides it by its speedup).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
@click.pass_context
def plan(ctx: click.Context, config_path: Path, instance_type: str | None, all_instances: bool,
         ms_per_token: float | None, as_json: bool) -> None:
    """Device memory, NeuronCores, load order and cost of CONFIG's models on an instance.

    Exit code 0 when the config is valid there and the models fit, 1 otherwise.
    """
    config = load_config(config_path)
    if all_instances:
        plans = plan_all_instances(config, ms_per_token)
        if as_json:
            click.echo(_json([_option_dict(p) for p in plans]))
        else:
            _print_instances(Console(), config, plans)
        ctx.exit(0 if any(_hosts(p) for p in plans) else 1)
    deployment = plan_deployment(config, instance_type, ms_per_token)
    report = validate_config(_on_neuron(config, deployment.instance.name))
    if as_json:
        click.echo(_json({**deployment.to_dict(), "validation": report.to_dict()}))
    else:
        console = Console()
        _print_plan(console, deployment)
        if report.errors or report.warnings:
            _print_report(console, str(config_path), report)
    ctx.exit(0 if report.ok and deployment.fits else 1)


def _validate_file(path: Path) -> ValidationReport:
    try:
        config = load_config(path)
    except UsageError as exc:
        return ValidationReport(errors=list(exc.problems))
    return validate_config(config)


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
    console.print(f"[bold]{path}[/bold]: {verdict}{warned}")
    if report.errors or report.warnings:
        table = _table("", "field", "value", "rule", "fix", show_lines=True)
        for kind, problems in ((ERROR, report.errors), (WARNING, report.warnings)):
            for p in problems:
                table.add_row(kind, p.field, repr(p.value), p.rule, p.fix)
        console.print(table)
    if report.load_order:
        console.print(f"  load order: {' -> '.join(report.load_order)}")


def _print_plan(console: Console, deployment: DeploymentPlan) -> None:
    instance = deployment.instance
    console.print(f"[bold]plan: {deployment.config_name} on {instance.name}[/bold] ({instance.neuron_cores} "
                  f"NeuronCores x {instance.hbm_per_core_gib} GiB HBM, {instance.generation})")
    table = _table("model", "architecture", "params", "dtype", "weights", "KV cache", "tp", "cores",
                   "GiB/core = weights + KV", "cores needed", "smallest tp alone")
    for role, m in deployment.models.items():
        usage = m.footprint
        per_core = (f"{gib(usage.bytes_per_core):.2f} = {gib(usage.weight_bytes_per_core):.2f}"
                    f" + {gib(usage.kv_bytes_per_core):.2f}")
        table.add_row(role, m.architecture.name, f"{m.architecture.params / 1e9:.2f} B", m.dtype,
                      f"{gib(usage.weight_bytes):.1f} GiB", f"{gib(usage.kv_bytes):.2f} GiB",
                      str(m.tp_degree), str(m.cores), per_core, f"{m.cores_needed:.1f}",
                      str(m.smallest_fitting_tp or "none"))
    console.print(table)
    busiest, usable = deployment.busiest_core_bytes, deployment.usable_bytes_per_core
    if not deployment.within_instance:
        verdict = f"[red]does not fit: uses cores beyond the {instance.neuron_cores} of {instance.name}[/red]"
    elif deployment.fits:
        verdict = f"[green]fits, {gib(usable - busiest):.2f} GiB spare[/green]"
    else:
        verdict = f"[red]does not fit: {gib(busiest - usable):.2f} GiB too much[/red]"
    console.print(f"busiest core: {gib(busiest):.2f} GiB of {gib(usable):.2f} GiB usable "
                  f"({instance.hbm_per_core_gib} GiB HBM, {deployment.headroom_fraction:.0%} kept as "
                  f"headroom) -> {verdict}")
    fitting = ", ".join(str(tp) for tp in deployment.fitting_tp_degrees) or "none"
    console.print(f"one tp for all models that fits: {fitting}; "
                  f"recommended: {deployment.recommended_tp or 'none'}")
    console.print(f"load order: {' -> '.join(deployment.load_order)}; "
                  f"NEURON_RT_VISIBLE_CORES={deployment.visible_cores}")
    console.print(_cost_line(deployment))
    console.print("cores needed = (weights + KV cache) / usable HBM per core, before rounding up to a tp "
                  "degree the platform accepts (smallest tp alone)")


def _cost_line(deployment: DeploymentPlan) -> str:
    if deployment.cost_per_hour is None:
        return f"cost: no on-demand price for {deployment.instance.name}"
    line = f"cost: ${deployment.cost_per_hour:.2f}/h on demand [{deployment.instance.price_source}]"
    if deployment.cost_per_million_tokens is None:
        return f"{line}; per million tokens: {deployment.ms_per_token_source}"
    return (f"{line}; ${deployment.cost_per_million_tokens:.2f} per million generated tokens at "
            f"{deployment.ms_per_token:g} ms/token ({deployment.ms_per_token_source})")


def _print_instances(console: Console, config: Config, plans: list[DeploymentPlan]) -> None:
    names = " + ".join(m.architecture.name for m in plans[0].models.values())
    console.print(f"[bold]{config.name}: which instances can host {names}[/bold] "
                  f"(one tp for all models, {plans[0].headroom_fraction:.0%} of HBM kept as headroom)")
    table = _table("instance", "cores", "hosts?", "tp that fit", "recommended tp", "GiB/core", "$/h",
                   "$/M tokens")
    for p in plans:
        hosts = _hosts(p)
        table.add_row(p.instance.name, str(p.instance.neuron_cores), _option_dict(p)["hosts"],
                      ", ".join(str(tp) for tp in p.fitting_tp_degrees) or "-", str(p.recommended_tp or "-"),
                      f"{gib(p.busiest_core_bytes):.2f}" if hosts else "-", _money(p.cost_per_hour),
                      _money(p.cost_per_million_tokens) if hosts else "-")
    console.print(table)
    console.print("GiB/core at the recommended tp. $/M tokens at the published plain-decoding latency of the "
                  "target on that platform (or --ms-per-token); '-' where none is published.")


def _table(*columns: str, show_lines: bool = False) -> Table:
    table = Table(show_lines=show_lines)
    for column in columns:
        table.add_column(column)
    return table


def _money(amount: float | None) -> str:
    return "-" if amount is None else f"{amount:.2f}"


def _option_dict(deployment: DeploymentPlan) -> dict[str, Any]:
    if deployment.instance.generation == "trn2":
        hosts = "no: trn2 needs NxD Inference"
    elif deployment.recommended_tp is None:
        hosts = "no: does not fit at any tp"
    else:
        hosts = "yes"
    return {
        "instance": deployment.instance.name, "neuron_cores": deployment.instance.neuron_cores,
        "hosts": hosts, "fitting_tp_degrees": deployment.fitting_tp_degrees,
        "recommended_tp": deployment.recommended_tp, "busiest_core_bytes": deployment.busiest_core_bytes,
        "cost_per_hour": deployment.cost_per_hour, "ms_per_token": deployment.ms_per_token,
        "cost_per_million_tokens": deployment.cost_per_million_tokens,
    }


def _json(data: Any) -> str:
    return json.dumps(data, indent=2)
