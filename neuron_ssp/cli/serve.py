"""serve: the pipeline behind an OpenAI-compatible HTTP server (and SageMaker's container contract)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.console import Group
from rich.table import Table

from neuron_ssp.cli.generate import load_with_status
from neuron_ssp.cli.options import echo_json, json_list, prompts_option, set_threads, threads_option
from neuron_ssp.cli.report import console, describe, status_console
from neuron_ssp.config import Config, load_config
from neuron_ssp.errors import Problem, RuntimeProblem, UsageError

if TYPE_CHECKING:
    from neuron_ssp.tools.serve_sweep import SweepResult

# flag -> serve.* field it overrides
SERVE_OVERRIDES = (
    "host",
    "port",
    "sagemaker",
    "max_queue",
    "max_batch",
    "request_timeout",
    "api_key_env",
    "served_model_name",
    "allowed_origins",
)


def missing_serve_packages(command: str, exc: ImportError) -> RuntimeProblem:
    """A server command (serve, bench-serve) without the serve extra: what to install, not a traceback."""
    return RuntimeProblem(
        Problem(
            command,
            exc.name,
            "the server's packages are not installed",
            "pip install 'neuron-ssp[serve]' (fastapi, uvicorn, prometheus-client, and httpx for bench-serve)",
        )
    )


@click.command()
@click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path),
    help="YAML config (default: the embedded SmolLM2 default); its `serve:` section sets the fields below.",
)
@click.option("--host", help="Interface to listen on (default 127.0.0.1; 0.0.0.0 with --sagemaker).")
@click.option("--port", type=int, help="Port (default 8000; 8080 with --sagemaker).")
@click.option(
    "--sagemaker",
    is_flag=True,
    default=None,
    help="SageMaker's container contract: 0.0.0.0:8080 (an explicit --host/--port still wins).",
)
@click.option("--max-queue", type=int, help="Requests that may wait behind the running ones; more get 503.")
@click.option(
    "--max-batch",
    type=int,
    help="Requests generated together (continuous batching; default 8; "
    "on Neuron at most the compiled target.batch_size; docs/serving.md).",
)
@click.option(
    "--request-timeout",
    type=float,
    help="Seconds a request may take, queue wait included (default 300; 55 with --sagemaker).",
)
@click.option("--api-key-env", help="Name of the environment variable holding the API key clients must send.")
@click.option("--served-model-name", help="The `model` name clients send (default: the target's name).")
@click.option(
    "--allowed-origins",
    callback=lambda ctx, param, value: json_list(value, "--allowed-origins"),
    help="Origins a browser page may call the API from, as a JSON list (CORS; default '[\"*\"]', as vLLM).",
)
@threads_option
def serve(config_path: Path | None, threads: int | None, **flags: object) -> None:
    """Serve the model pair over HTTP: OpenAI /v1/chat/completions and /v1/completions, /v1/models,
    /health, /metrics, SageMaker /ping and /invocations, and a playground page at /.

    Loads and validates the models once, before the port opens. SIGTERM drains and exits 0.
    With neuron.library vllm-neuron it runs `vllm serve` for the config instead (deploy/vllm_neuron.py).
    """
    config = load_config(config_path, {f"serve.{name}": flags[name] for name in SERVE_OVERRIDES})
    if config.platform.backend == "neuron" and config.neuron.library == "vllm-neuron":
        from neuron_ssp.deploy.vllm_neuron import exec_vllm_serve

        exec_vllm_serve(config)  # replaces this process
    try:
        from neuron_ssp.serve.server import run_server, serving
    except ImportError as exc:
        raise missing_serve_packages("serve", exc) from None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    started = serving(config)  # a missing key is refused before the models load
    set_threads(threads)
    click.echo(f"{describe(config)}", err=True)
    run_server(config, load_with_status(config, started.batch.rows), started)
    click.echo(f"neuron-ssp serve on {started.listen.url} stopped", err=True)


@click.command("bench-serve")
@click.option("--config", "config_path", type=click.Path(path_type=Path), help="YAML config the servers run.")
@click.option("--clients", type=click.IntRange(min=1), default=8, show_default=True, help="Concurrent clients.")
@click.option(
    "--requests",
    type=click.IntRange(min=1),
    default=4,
    show_default=True,
    help="Requests per client (--sweep: per client at the highest concurrency).",
)
@click.option("--max-tokens", type=click.IntRange(min=1), default=16, show_default=True, help="Tokens per request.")
@click.option(
    "--pairs",
    type=click.IntRange(min=1),
    default=8,
    show_default=True,
    help="Direct vs HTTP pairs for the overhead target.",
)
@click.option(
    "--overflow-queue",
    type=click.IntRange(min=1),
    default=2,
    show_default=True,
    help="max_queue of the overflow server.",
)
@click.option("--timeout", "timeout_s", type=float, default=600.0, show_default=True, help="Per-request timeout (s).")
@click.option("--threads", type=click.IntRange(min=1), help="torch CPU threads here and in the servers.")
@prompts_option
@click.option(
    "--repeated",
    is_flag=True,
    help="Instead: the suffix drafter's repeated-workload gain through the server, the prompts twice, "
    "greedy clients and clients sending temperature + seed side by side.",
)
@click.option(
    "--sweep",
    is_flag=True,
    help="Instead: concurrency sweep of three servers side by side (batch-1 speculation, continuous "
    "batching without and with speculation), every level serving the same --requests x max(--concurrency) "
    "requests: tokens/s, server CPU time per token, TTFT and time per output token per level.",
)
@click.option("--concurrency", default="1,2,4,8,16", show_default=True, help="--sweep: client counts, comma-separated.")
@click.option(
    "--max-batch",
    type=click.IntRange(min=1),
    default=16,
    show_default=True,
    help="--sweep: serve.max_batch of the batching servers.",
)
@click.option("--plot", "plot_path", type=click.Path(path_type=Path), help="--sweep: save the sweep as a PNG.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
def bench_serve(
    config_path: Path | None,
    clients: int,
    requests: int,
    max_tokens: int,
    pairs: int,
    overflow_queue: int,
    timeout_s: float,
    threads: int | None,
    prompts_file: Path,
    repeated: bool,
    sweep: bool,
    concurrency: str,
    max_batch: int,
    plot_path: Path | None,
    as_json: bool,
) -> None:
    """Load-test `neuron-ssp serve` on loopback: HTTP overhead, N clients x M requests, queue overflow."""
    import tempfile

    from rich.progress import Progress

    try:
        from neuron_ssp.tools.serve_load import run_repeated_through_server, run_serve_bench, total_steps
    except ImportError as exc:
        raise missing_serve_packages("bench-serve", exc) from None

    config = load_config(config_path)
    prompts = [json.loads(line)["prompt"] for line in prompts_file.read_text().splitlines() if line.strip()]
    if sweep:
        levels = parse_levels(concurrency)
        run_sweep_command(
            config, prompts, levels, requests, max_tokens, max_batch, threads, timeout_s, plot_path, as_json
        )
        return
    if repeated:
        with tempfile.TemporaryDirectory() as logs, Progress(console=status_console, transient=True) as progress:
            task = progress.add_task("bench-serve --repeated", total=4 * len(prompts))
            report = run_repeated_through_server(
                config, prompts, max_tokens, threads, timeout_s, Path(logs), lambda _: progress.advance(task)
            )
        if as_json:
            echo_json(report)
        else:
            console.print(repeated_table(report))
        return
    pipeline = load_with_status(config)
    with tempfile.TemporaryDirectory() as logs, Progress(console=status_console, transient=True) as progress:
        task = progress.add_task("bench-serve", total=total_steps(clients, requests, pairs))
        result = run_serve_bench(
            config,
            config_path,
            pipeline,
            prompts,
            clients,
            requests,
            max_tokens,
            pairs,
            overflow_queue,
            threads,
            timeout_s,
            Path(logs),
            lambda _: progress.advance(task),
        )
    if as_json:
        echo_json(result.to_dict())
        return
    console.print(serve_bench_tables(result.to_dict()))


def parse_levels(text: str) -> tuple[int, ...]:
    try:
        levels = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        levels = ()
    if not levels or levels[0] < 1:
        raise UsageError(
            Problem(
                "--concurrency",
                text,
                "must be positive client counts separated by commas",
                "pass e.g. --concurrency 1,2,4,8,16",
            )
        )
    return levels


def run_sweep_command(
    config: Config,
    prompts: list[str],
    levels: tuple[int, ...],
    requests: int,
    max_tokens: int,
    max_batch: int,
    threads: int | None,
    timeout_s: float,
    plot_path: Path | None,
    as_json: bool,
) -> None:
    import tempfile

    from rich.progress import Progress

    from neuron_ssp.tools import serve_sweep

    if plot_path is not None:
        from neuron_ssp.tools.plots import figure_class

        figure_class()  # matplotlib missing: say so before the run, not after
    with tempfile.TemporaryDirectory() as logs, Progress(console=status_console, transient=True) as progress:
        task = progress.add_task("bench-serve --sweep", total=serve_sweep.total_steps(levels, requests))
        result = serve_sweep.run_sweep(
            config,
            prompts,
            levels,
            requests,
            max_tokens,
            max_batch,
            threads,
            timeout_s,
            Path(logs),
            lambda _: progress.advance(task),
        )
    if plot_path is not None:
        from neuron_ssp.tools.plots import plot_sweep

        plot_sweep(
            result,
            plot_path,
            f"bench-serve --sweep: {config.name}, drafter {config.speculation.drafter}, "
            f"max_batch {max_batch}, {max_tokens} tokens, {requests} requests per client",
        )
    if as_json:
        echo_json({**result.to_dict(), "targets": serve_sweep.targets(result)})
        return
    console.print(sweep_tables(result))


def sweep_tables(result: SweepResult) -> Group:
    """Per mode and concurrency, then the targets (80 columns wide)."""
    from neuron_ssp.tools import serve_sweep

    load = Table(
        title=f"bench-serve --sweep, {result.settings['requests_per_pass']} requests a pass (tokens/s; seconds)",
        title_justify="left",
    )
    for name in ("mode", "c", "tok/s", "CPU/tok", "TTFT p50/p95", "TPOT p50/p95", "err"):
        load.add_column(name, justify="right" if name != "mode" else "left")
    for mode in serve_sweep.MODES:
        for c, m in sorted(result.runs[mode].items()):
            load.add_row(
                mode,
                str(c),
                f"{m['output_tokens_per_s']:.1f}",
                f"{m['cpu_ms_per_token']:.1f} ms" if m["cpu_ms_per_token"] is not None else "n/a",
                f"{m['ttft_p50_s']:.2f}/{m['ttft_p95_s']:.2f}",
                f"{m['tpot_p50_s'] * 1000:.0f}/{m['tpot_p95_s'] * 1000:.0f} ms",
                str(m["errors"]),
            )
    goals = Table(title="targets", title_justify="left")
    for name in ("target", "measured", "goal", "met"):
        goals.add_column(name)
    for name, measured, goal, met in serve_sweep.targets(result):
        goals.add_row(name, measured, goal, "yes" if met else "[red]no[/red]")
    codes = "; ".join(f"{mode}: {code}" for mode, code in result.exit_codes.items())
    hits = max(m.get("prefix_cache_hit_rate", 0.0) for runs in result.runs.values() for m in runs.values())
    caching = f"prefix caching {'on' if result.settings.get('prefix_cache') else 'off'} (highest hit rate {hits:.3f})"
    return Group(load, goals, f"servers' exit codes on SIGTERM: {codes}; {caching}")


def serve_bench_tables(r: dict[str, Any]) -> Group:
    """The three targets, then the load table (80 columns wide)."""
    o, c, f = r["overhead"], r["concurrency"], r["overflow"]
    targets = Table(title="bench-serve targets", title_justify="left")
    for name in ("target", "measured", "goal", "met"):
        targets.add_column(name)
    rows = [
        (
            "HTTP+queue vs direct",
            f"{o['ratio']:.3f}x ({o['same_text']}/{o['pairs']} same)",
            "<= 1.05x",
            o["ratio"] <= 1.05,
        ),
        (
            f"{r['settings']['clients']} clients tok/s vs 1",
            f"{c['throughput_ratio']:.3f}x",
            ">= 0.95x",
            c["throughput_ratio"] >= 0.95,
        ),
        (
            "errors / lost / differing",
            f"{c['concurrent']['errors']} / {c['lost']} / {c['outputs_differing']}",
            "0 / 0 / 0",
            c["concurrent"]["errors"] == c["lost"] == c["outputs_differing"] == 0,
        ),
        (
            f"overflow (queue {r['settings']['overflow_queue']})",
            f"{f['ok']} x 200, {f['http_503']} x 503, {f['errors']} other",
            "200/503 only",
            f["all_200_or_503_in_time"] and f["healthy_after"],
        ),
    ]
    for name, measured, goal, met in rows:
        targets.add_row(name, measured, goal, "yes" if met else "[red]no[/red]")
    load = Table(title="load (seconds)", title_justify="left")
    for name in ("run", "req/s", "tok/s", "TTFT p50/p95/p99", "e2e p50/p95/p99", "err", "503"):
        load.add_column(name, justify="right")
    for name, s in (("sequential", c["sequential"]), ("concurrent", c["concurrent"]), ("overflow", f)):
        load.add_row(
            name,
            f"{s['requests_per_s']:.2f}",
            f"{s['output_tokens_per_s']:.1f}",
            f"{s['ttft_p50_s']:.2f}/{s['ttft_p95_s']:.2f}/{s['ttft_p99_s']:.2f}",
            f"{s['e2e_p50_s']:.1f}/{s['e2e_p95_s']:.1f}/{s['e2e_p99_s']:.1f}",
            str(s["errors"]),
            str(s["http_503"]),
        )
    rates = " / ".join(f"{rate:.3f}" for rate in c["prefix_cache_hit_rate"])
    hits = f"prefix-cache hit rate (prompt tokens found / looked up), sequential / concurrent / sequential: {rates}"
    return Group(targets, load, hits)


def repeated_table(r: dict[str, Any]) -> Table:
    """First and second pass per kind of client, and the second pass's gain, side by side."""
    table = Table(
        title=f"repeated workload through the server, drafter suffix ({r['settings']['prompts']} prompts "
        f"x 2 passes, {r['settings']['max_tokens']} tokens)",
        title_justify="left",
    )
    for name in ("clients", "tok/s 1", "tok/s 2", "gain", "tok/call 1", "tok/call 2", "err"):
        table.add_column(name, justify="right")
    for kind, k in r["kinds"].items():
        first, second = k["first"], k["second"]
        table.add_row(
            kind,
            f"{first['tokens_per_s']:.2f}",
            f"{second['tokens_per_s']:.2f}",
            f"{k['gain']:.3f}x",
            f"{first['tokens_per_call']:.2f}",
            f"{second['tokens_per_call']:.2f}",
            str(first["errors"] + second["errors"]),
        )
    return table
