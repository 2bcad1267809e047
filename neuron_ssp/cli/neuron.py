"""`neuron-ssp compile` (compiled models per k, reused at load) and `neuron-ssp doctor` (what this host has).

Both are safe to run anywhere: without transformers-neuronx or a Neuron device, compile stops with
what to install or where to run, and doctor says what still works on this machine.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from neuron_ssp.backends.neuron.env import (
    DLAMI_VENV,
    active_venv,
    compile_cache,
    package_versions,
    probe_devices,
    stack_warning,
)
from neuron_ssp.config import Config, load_config
from neuron_ssp.errors import NeuronSSPError, Problem, UsageError
from neuron_ssp.topology import plan_deployment, validate_config
from neuron_ssp.topology.catalog import GIB
from neuron_ssp.topology.compile_plan import PROCESS_BYTES
from neuron_ssp.topology.parallelism import KV_PADDING

NEEDS_NEURON = {"compile"}  # commands that need a Neuron device; `generate` etc. need one only with backend neuron


@click.command("compile")
@click.argument("config_path", metavar="CONFIG", type=click.Path(path_type=Path))
@click.option(
    "--k",
    "ks_text",
    metavar="KS",
    help="Windows to compile: one (4), a range (2..8) or a list (2,4,6). Default: speculation.k. "
    "The draft proposes k-1 tokens; the target is compiled to score k per call.",
)
@click.option("--out", help="Where to keep them: a directory or s3://bucket/prefix (default: neuron.compiled_dir).")
@click.option("--force", is_flag=True, help="Compile again even where matching artifacts exist.")
@click.option(
    "--compile-process-gib",
    type=click.FloatRange(min=0, min_open=True),
    default=PROCESS_BYTES / GIB,
    show_default=True,
    help="Host memory of one neuronx-cc process (an assumption until measured): "
    "bounds how many run at once beside the checkpoint in the host's free memory.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
def compile_command(
    config_path: Path, ks_text: str | None, out: str | None, force: bool, compile_process_gib: float, as_json: bool
) -> None:
    """Compile CONFIG's draft once and its target for every k, and keep each for reuse at load.

    transformers-neuronx: one target holds every k. NxD Inference (neuron.library: nxdi): one target per k
    (NxDI compiles one speculation width per model), kept with NxDI's compile(dir). Loading (generate,
    compare, tune-k ... with platform.backend neuron) reuses a compiled model when the model's config.json,
    n_positions, dtype, tp_degree, k and the library version (NxDI: its whole NeuronConfig) all match;
    otherwise it compiles again. neuronx-cc also keeps its own cache of compiled graphs in
    NEURON_COMPILE_CACHE_URL (default /var/tmp/neuron-compile-cache; s3:// works too).
    """
    from neuron_ssp.backends.neuron.compile import Compiler
    from neuron_ssp.backends.nxdi.compile import NxdiCompiler
    from neuron_ssp.topology.vllm_neuron import refuse_loading

    config = load_config(config_path, {"neuron.compiled_dir": out})
    refuse_loading(config, "compile")
    ks = parse_ks(ks_text, config.speculation.k)
    widest = config.model_copy(update={"speculation": config.speculation.model_copy(update={"k": max(ks)})})
    nxdi = config.neuron.library == "nxdi"
    compiler = (
        NxdiCompiler(widest, plan_deployment(widest), ks, force)
        if nxdi
        else Compiler(widest, plan_deployment(widest), ks, force, int(compile_process_gib * GIB))
    )
    # transformers-neuronx: its networks, processes and host memory; NxDI: the graphs of its buckets
    estimate = None if isinstance(compiler, NxdiCompiler) else compiler.estimate
    console = Console(stderr=as_json)
    for line in compiler.lines() if isinstance(compiler, NxdiCompiler) else compiler.estimate.lines():
        console.print(line, highlight=False)
    columns = (
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    results = []
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("compiling", total=len(compiler.jobs))
        for job in compiler.jobs:
            progress.update(task, description=f"compiling {job.label}")
            result = compiler.run(job)
            what = "already compiled, reused" if result.reused else f"compiled in {result.seconds:.1f} s"
            progress.console.print(f"{job.label}: {what} -> {result.location}")
            progress.advance(task)
            results.append(result)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "estimate": estimate.to_dict() if estimate else None,
                    "graphs": compiler.graph_counts() if isinstance(compiler, NxdiCompiler) else None,
                    "results": [
                        {
                            "role": r.job.role,
                            "k": list(r.job.speculation_lengths or []) or None,
                            "seconds": r.seconds,
                            "reused": r.reused,
                            "location": r.location,
                        }
                        for r in results
                    ],
                },
                indent=2,
            )
        )


def parse_ks(text: str | None, default: int) -> list[int]:
    """'4' | '2..8' | '2,4,6' -> sorted distinct windows, each >= 2."""
    if text is None:
        return [default]
    text = text.strip()
    if match := re.fullmatch(r"(\d+)\s*\.\.\s*(\d+)", text):
        ks = list(range(int(match[1]), int(match[2]) + 1))
    elif re.fullmatch(r"\d+(\s*,\s*\d+)*", text):
        ks = [int(part) for part in text.split(",")]
    else:
        raise UsageError(Problem("--k", text, "not a window, range or list", "write 4, 2..8 or 2,4,6"))
    if not ks or min(ks) < 2:
        raise UsageError(
            Problem("--k", text, "every k must be >= 2 (k-1 drafted tokens + 1)", "start the range at 2 or more")
        )
    return sorted(set(ks))


@click.command("doctor")
@click.option("--instance", "instance_type", help="Instance type to check configs against (default: detected).")
@click.option(
    "--configs",
    "configs_dir",
    type=click.Path(path_type=Path),
    default=Path("configs"),
    show_default=True,
    help="Directory of YAML configs to check against this instance.",
)
@click.option(
    "--self-test",
    "self_test_config",
    metavar="CONFIG",
    type=click.Path(path_type=Path),
    help="Load CONFIG's target and check its k-wide window against one-token calls (positions below and "
    "above 64); exit 1 when they disagree. Needs a Neuron device.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
@click.option(
    "--check-model",
    "check_models",
    multiple=True,
    metavar="PATH",
    help="Also run the known-answer check on this model (a local HF directory or embedded:NAME): "
    "loads it on CPU and checks its loss on a reference sentence. Exit 1 if it fails.",
)
@click.pass_context
def doctor(
    ctx: click.Context,
    instance_type: str | None,
    configs_dir: Path,
    self_test_config: Path | None,
    as_json: bool,
    check_models: tuple[str, ...],
) -> None:
    """What this machine offers for Neuron: devices, packages, venv, compile cache, configs that fit."""
    if self_test_config is not None:
        ctx.exit(run_doctor_self_test(self_test_config, as_json))
    report = doctor_report(instance_type, configs_dir, _commands_without_neuron(ctx))
    if check_models:
        from neuron_ssp.tools.model_check import check_model

        report["model_checks"] = [check_model(path) for path in check_models]
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        print_doctor(Console(), report)
    if not all(check["passed"] for check in report.get("model_checks", [])):
        ctx.exit(1)


def run_doctor_self_test(config_path: Path, as_json: bool) -> int:
    """`doctor --self-test CONFIG`: the load-time self-test on its own, with its per-position figures."""
    from neuron_ssp.backends.neuron.selftest import (
        check_self_test,
        library_label,
        self_test,
        static_batch_self_test_skip,
    )
    from neuron_ssp.backends.resolve import resolve_models
    from neuron_ssp.pipeline.load import load_neuron_models

    config = load_config(config_path)
    if static_batch_self_test_skip(config) is not None:  # the library's static build cannot score one row
        click.echo(
            f"note: engine {config.speculation.engine} at target.batch_size {config.target.batch_size}: this "
            "checks our loop's build of the target at that batch (continuous batching), not the static-batch "
            "build the engine loads; for that one, run the self-test with target.batch_size: 1 and "
            "draft.batch_size: 1",
            err=True,
        )
    neuron = config.neuron.model_copy(update={"self_test": False})  # run it here, where we can print it
    speculation = config.speculation.model_copy(update={"drafter": "ngram", "engine": "native"})
    target_only = config.model_copy(update={"neuron": neuron, "draft": None, "speculation": speculation})
    dirs = resolve_models(target_only)
    target, _ = load_neuron_models(target_only, plan_deployment(target_only), dirs)
    result = self_test(target, config, _library_version(config), dirs.target)
    judgement = result.judgement
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
    else:
        console = Console()
        verdict = "[green]passed[/green]" if judgement.passed else "[bold red]FAILED[/bold red]"
        console.print(
            f"self-test, {library_label(result.library_version)}, k={judgement.k}, {escape(result.text)}: {verdict}"
        )
        console.print(f"  {escape(judgement.summary())}")
        for failure in judgement.failures:
            console.print(f"  [red]{escape(failure)}[/red]")
        table = Table(
            "slot", "KL (nats)", "max |Δlogit| / std", "argmax", title="per cache position", title_justify="left"
        )
        for row in judgement.rows:
            table.add_row(
                str(row.position),
                f"{row.kl:.3g}",
                f"{row.relative_diff:.3g}",
                "same" if row.argmax_agrees else "[red]differs",
            )
        console.print(table)
    check_self_test(result)
    return 0


def _library_version(config: Config) -> str:
    """What the self-test names: 'neuronx-distributed-inference 0.9.x', or transformers-neuronx's bare version."""
    if config.neuron.library == "nxdi":
        from neuron_ssp.backends.neuron.selftest import NXDI
        from neuron_ssp.backends.nxdi.api import installed_version

        return f"{NXDI} {installed_version()}"
    from neuron_ssp.backends.neuron.api import load_neuronx

    return load_neuronx().version


def doctor_report(instance_type: str | None, configs_dir: Path, usable_commands: list[str]) -> dict[str, Any]:
    devices = probe_devices(instance_type)
    venv, is_dlami_venv = active_venv()
    cache = compile_cache()
    library = _library_status()
    versions = package_versions()
    return {
        "neuron_device_present": devices.present,
        "device_nodes": devices.device_nodes,
        "neuron_ls": devices.neuron_ls,
        "neuron_ls_error": devices.neuron_ls_error,
        "neuron_cores": devices.cores,
        "instance_type": devices.instance_type,
        "instance_source": devices.instance_source,
        "packages": versions,
        "neuron_stack_warning": stack_warning(versions),
        "transformers_neuronx": library,
        "nxdi": _nxdi_status(devices.instance_type),
        "structured_output": _structured_output_status(),
        "python_env": venv,
        "dlami_venv": is_dlami_venv,
        "dlami_venv_on_disk": Path(DLAMI_VENV).is_dir(),
        "compile_cache": {"url": cache.url, "from_env": cache.from_env, "free_bytes": cache.free_bytes},
        "configs": _config_fits(configs_dir, devices.instance_type, library.get("kv_rule", KV_PADDING)),
        "works_here": usable_commands if not devices.present else usable_commands + sorted(NEEDS_NEURON),
    }


def _structured_output_status() -> dict[str, Any]:
    """Whether grammars (response_format, tools, ...) run here: llguidance imports, and the glibc its wheel needs."""
    from neuron_ssp.speculation.grammar import glibc_version, grammar_support_problem

    found = glibc_version()
    problem = grammar_support_problem("structured output")
    status: dict[str, Any] = {"usable": problem is None, "glibc": ".".join(map(str, found)) if found else None}
    if problem is not None:
        status.update(problem=problem.rule, fix=problem.fix)
    return status


def _library_status() -> dict[str, Any]:
    from neuron_ssp.backends.neuron.api import load_neuronx

    try:
        api = load_neuronx()
    except NeuronSSPError as exc:
        return {"usable": False, "problem": exc.problems[0].rule, "fix": exc.problems[0].fix}
    return {"usable": True, "version": api.version, "api_generation": api.generation, "kv_rule": api.kv_rule}


def _nxdi_status(instance_type: str | None) -> dict[str, Any]:
    """NxD Inference: installed here (and usable: it imports with what we call), its SDK, the DLAMI venvs, and the
    release this instance's family needs (topology/nxdi_releases.py) with how to install it."""
    from neuron_ssp.backends.nxdi.env import LAST_TRN1_INF2_SDK, probe_nxdi
    from neuron_ssp.topology.catalog import find_instance
    from neuron_ssp.topology.nxdi_releases import install_advice, release_for

    install = probe_nxdi()
    instance = find_instance(instance_type or "")
    family = instance.generation if instance else None
    needed = release_for(family) if family else None
    status: dict[str, Any] = {
        "version": install.version,
        "sdk": install.sdk,
        "dlami_venvs": install.venvs,
        "runs_trn1_inf2": install.runs_trn1_inf2,
        "last_trn1_inf2_sdk": LAST_TRN1_INF2_SDK,
        "family": family,
        "release_needed": needed.nxdi if needed else None,
        "release_fits": None if needed is None or install.sdk is None else install.sdk == needed.sdk,
    }
    if status["release_fits"] is False:
        status["release_advice"] = install_advice(family)
    if install.version is None:
        return {
            **status,
            "usable": False,
            "problem": "neuronx-distributed-inference is not installed",
            "fix": f"{install_advice(family)}. Without Neuron hardware use platform.backend: torch",
        }
    from neuron_ssp.backends.nxdi.api import load_nxdi

    try:
        load_nxdi(family)
    except NeuronSSPError as exc:
        return {**status, "usable": False, "problem": exc.problems[0].rule, "fix": exc.problems[0].fix}
    return {**status, "usable": True}


def _config_fits(configs_dir: Path, instance_type: str | None, kv_rule: str) -> list[dict[str, Any]]:
    """Each config against this instance, as the installed transformers-neuronx lays out kv heads."""
    rows, loaded = [], {}
    for path in sorted(configs_dir.glob("*.yaml")) if configs_dir.is_dir() else []:
        try:
            config = load_config(path)
        except UsageError as exc:
            rows.append({"config": str(path), "status": "invalid", "detail": str(exc.problems[0])})
            continue
        loaded[str(path)] = config
        rows.append({"config": str(path), **_fit(config, instance_type, kv_rule)})
    for row in rows:
        if row["status"].startswith("made for"):
            row["detail"] += _sibling_hint(loaded[row["config"]], loaded, instance_type)
    return rows


def _fit(config: Config, instance_type: str | None, kv_rule: str) -> dict[str, str]:
    """A config made for another instance says so; it is not a config to rewrite with this one's rules."""
    if config.platform.backend == "torch":
        return {"status": "runs here", "detail": "torch reference backend: any machine"}
    made_for = config.platform.instance_type
    if instance_type is None:
        return {
            "status": "unknown",
            "detail": f"made for {made_for}; pass --instance to check it against this machine",
        }
    platform = config.platform.model_copy(update={"instance_type": instance_type})
    report = validate_config(config.model_copy(update={"platform": platform}), kv_rule)
    elsewhere = made_for is not None and made_for != instance_type
    if report.ok:
        return {
            "status": "fits",
            "detail": f"valid on {instance_type}" + (f" (made for {made_for})" if elsewhere else ""),
        }
    if elsewhere:
        return {"status": f"made for {made_for}", "detail": f"this is {instance_type}"}
    return {"status": "not valid here", "detail": f"on {instance_type}: {report.errors[0]}"}


def _sibling_hint(config: Config, loaded: dict[str, Config], instance_type: str | None) -> str:
    """The config of the same models and dtype made for this instance, if one is in the directory."""

    def models(c: Config) -> tuple[Any, ...]:
        return (c.target.path, c.target.dtype, c.draft.path if c.draft else None)

    for path, other in loaded.items():
        if other.platform.instance_type == instance_type and models(other) == models(config):
            return f"; here use {Path(path).name}"
    return ""


def _commands_without_neuron(ctx: click.Context) -> list[str]:
    root = ctx.find_root().command
    names = root.list_commands(ctx) if isinstance(root, click.Group) else []
    return [name for name in names if name not in NEEDS_NEURON and name != "doctor"]


def print_doctor(console: Console, report: dict[str, Any]) -> None:
    if report["neuron_device_present"]:
        cores = report["neuron_cores"]
        console.print(
            f"[green]Neuron device present[/green]: {', '.join(report['device_nodes']) or '-'}"
            f"{f', {cores} NeuronCores' if cores else ''}"
        )
    else:
        console.print(
            "[bold red]No Neuron device on this machine[/bold red] (no /dev/neuron*"
            f"{', neuron-ls not installed' if not report['neuron_ls'] else ''})."
        )
    if report["neuron_ls_error"]:
        console.print(f"  neuron-ls: {report['neuron_ls_error']}")
    instance = report["instance_type"]
    console.print(f"instance type: {instance + ' (from ' + report['instance_source'] + ')' if instance else 'unknown'}")

    table = Table(
        title="versions in use (pinned when neuron-ssp is installed into a Neuron venv)", title_justify="left"
    )
    table.add_column("package")
    table.add_column("version")
    for name, version in report["packages"].items():
        table.add_row(name, version or "[dim]not installed[/dim]")
    console.print(table)
    if report["neuron_stack_warning"]:
        console.print(f"[yellow]{escape(report['neuron_stack_warning'])}[/yellow]")
    library = report["transformers_neuronx"]
    if library["usable"]:
        console.print(f"transformers-neuronx {library['version']} usable (API {library['api_generation']})")
    else:
        console.print(f"transformers-neuronx: [yellow]{escape(library['problem'])}[/yellow]")
        # soft_wrap: a command split over two lines does not paste into a shell
        console.print(f"  fix: {library['fix']}", soft_wrap=True, markup=False, highlight=False)
    print_nxdi(console, report["nxdi"])
    grammar = report["structured_output"]
    if grammar["usable"]:
        console.print(f"structured output (llguidance) usable (glibc {grammar['glibc']})")
    else:
        console.print(f"structured output: [yellow]{escape(grammar['problem'])}[/yellow]")
        console.print(f"  fix: {grammar['fix']}", soft_wrap=True, markup=False, highlight=False)
    venv_note = (
        "the DLAMI transformers-neuronx venv"
        if report["dlami_venv"]
        else (f"not the DLAMI venv {DLAMI_VENV}" + (" (present here)" if report["dlami_venv_on_disk"] else ""))
    )
    console.print(f"python environment: {report['python_env']} ({venv_note})")
    cache = report["compile_cache"]
    free = f", {cache['free_bytes'] / 1024**3:.1f} GiB free" if cache["free_bytes"] is not None else ""
    console.print(
        f"compile cache: {cache['url']} ({'NEURON_COMPILE_CACHE_URL' if cache['from_env'] else 'default'}{free})"
    )

    if report["configs"]:
        folder = Path(report["configs"][0]["config"]).parent
        configs = Table(title=f"configs in {folder}/", title_justify="left")
        configs.add_column("config", no_wrap=True)
        configs.add_column("status")
        for row in report["configs"]:
            configs.add_row(Path(row["config"]).name, f"[bold]{escape(row['status'])}[/bold]: {escape(row['detail'])}")
        console.print(configs)
    for check in report.get("model_checks", []):
        verdict = "[green]passed[/green]" if check["passed"] else "[bold red]FAILED[/bold red]"
        console.print(f"known-answer check of {check['path']} (transformers {check['transformers']}): {verdict}")
        for detail in check["details"]:
            console.print(f"  {detail}")
    works = ", ".join(report["works_here"])
    if report["neuron_device_present"]:
        console.print(f"[green]works here:[/green] {works}, with platform.backend neuron or torch")
    else:
        console.print(
            f"[green]Still works here:[/green] {works} (generation on the torch reference backend, "
            "platform.backend: torch; validate and plan need no hardware). "
            "Needs an inf2/trn1/trn2 instance: compile, and any config with platform.backend: neuron."
        )


def print_nxdi(console: Console, nxdi: dict[str, Any]) -> None:
    """NxD Inference: version and SDK, whether it runs Trn1/Inf2 models, the DLAMI venvs to activate."""
    if nxdi["usable"]:
        sdk = f"Neuron SDK {nxdi['sdk']}" if nxdi["sdk"] else "SDK unknown"
        where = {
            True: "Trn1, Inf2 and Trn2",
            False: f"Trn2 only (Trn1/Inf2: SDK {nxdi['last_trn1_inf2_sdk']})",
            None: "instance support unknown",
        }[nxdi["runs_trn1_inf2"]]
        console.print(f"NxD Inference {nxdi['version']} usable ({sdk}; models on {where}): neuron.library: nxdi")
    else:
        console.print(f"NxD Inference: [yellow]{escape(nxdi['problem'])}[/yellow]")
        console.print(f"  fix: {nxdi['fix']}", soft_wrap=True, markup=False, highlight=False)
    if nxdi["release_fits"] is False:
        needed = f"this {nxdi['family']} instance needs NxD Inference {nxdi['release_needed']}"
        console.print(f"  [yellow]{needed}[/yellow]: {escape(nxdi['release_advice'])}", soft_wrap=True, highlight=False)
    for venv in nxdi["dlami_venvs"]:
        console.print(f"  DLAMI NxD Inference venv here: {venv} (source {venv}/bin/activate)")
