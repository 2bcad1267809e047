"""generate / compare / latency: run the embedded default (or any config) and show the numbers."""

from __future__ import annotations

import json
from pathlib import Path
from statistics import mean

import click
from rich.progress import Progress

from neuron_ssp.cli.options import echo_json, prompts_option, set_threads, threads_option, with_config
from neuron_ssp.cli.report import console, describe, fit_fields, stats_table, status_console, titled_table
from neuron_ssp.config import Config
from neuron_ssp.errors import Problem, UsageError
from neuron_ssp.pipeline.load import load_pipeline
from neuron_ssp.pipeline.pipeline import Pipeline


def require_prompt(prompt: str) -> None:
    """Checked before any model loads: an empty prompt should cost nothing."""
    if not prompt.strip():
        raise UsageError(
            Problem(
                "prompt", prompt, "the prompt is empty", 'pass some text, e.g. neuron-ssp generate "Summarize: ..."'
            )
        )


def load_with_status(config: Config, max_batch: int = 1) -> Pipeline:
    with status_console.status(f"loading {config.target.path}"):
        return load_pipeline(config, max_batch)


@click.command()
@click.argument("prompt")
@threads_option
@with_config
def generate(config: Config, prompt: str, threads: int | None, as_json: bool) -> None:
    """Generate from PROMPT with speculative sampling; stream the text, then print stats."""
    require_prompt(prompt)
    set_threads(threads)
    pipeline = load_with_status(config)
    if as_json:
        out = pipeline.speculative(prompt)
        echo_json({"text": out.text, "tokens": out.tokens, "stats": out.result.stats.to_dict()})
        return
    console.print(f"[dim]{fit_fields(describe(config))}[/dim]")
    out = pipeline.speculative(prompt, on_text=lambda text: console.print(text, end="", markup=False, highlight=False))
    console.print()
    console.print(stats_table(out.result.stats))


@click.command()
@click.argument("prompt")
@click.option("--warmup", type=int, default=1, show_default=True, help="Untimed warm-up runs of each.")
@threads_option
@with_config
def compare(config: Config, prompt: str, warmup: int, threads: int | None, as_json: bool) -> None:
    """Plain target decoding vs speculative sampling on the same PROMPT, side by side."""
    require_prompt(prompt)
    set_threads(threads)
    pipeline = load_with_status(config)
    for _ in range(warmup):
        pipeline.plain(prompt, max_new_tokens=8)
        pipeline.speculative(prompt, max_new_tokens=8)
    plain = pipeline.plain(prompt)
    ssp = pipeline.speculative(prompt)
    p, s = plain.result.stats, ssp.result.stats
    speedup = s.tokens_per_s / p.tokens_per_s if p.tokens_per_s else 0.0
    if as_json:
        echo_json(
            {
                "plain": {"text": plain.text, "stats": p.to_dict()},
                "speculative": {"text": ssp.text, "stats": s.to_dict()},
                "speedup": speedup,
                "outputs_equal": plain.tokens == ssp.tokens,
            }
        )
        return
    table = titled_table(describe(config))
    table.add_column("")
    table.add_column("plain (target only)", justify="right")
    table.add_column("speculative", justify="right")
    table.add_row("new tokens", str(p.new_tokens), str(s.new_tokens))
    table.add_row("ms/token", f"{p.ms_per_token:.1f}", f"{s.ms_per_token:.1f}")
    table.add_row("tokens/s", f"{p.tokens_per_s:.1f}", f"{s.tokens_per_s:.1f}")
    table.add_row("target calls", str(p.target_calls), str(s.target_calls))
    table.add_row("acceptance rate", "-", f"{s.acceptance_rate:.3f}")
    table.add_row("mean accepted length", "1.00", f"{s.mean_accepted_length:.2f}")
    table.add_row("speedup", "1.00x", f"[bold]{speedup:.2f}x[/bold]")
    table.add_row("same tokens", "", "yes" if plain.tokens == ssp.tokens else "no (sampling)")
    console.print(table)
    console.rule("plain")
    console.print(plain.text, markup=False, highlight=False)
    console.rule("speculative")
    console.print(ssp.text, markup=False, highlight=False)


@click.command()
@click.option("--nb-prompts", type=int, default=4, show_default=True, help="Prompts from the benchmark set.")
@click.option("--warmup", type=int, default=1, show_default=True, help="Untimed warm-up prompts.")
@prompts_option
@threads_option
@with_config
def latency(
    config: Config, nb_prompts: int, warmup: int, prompts_file: Path, threads: int | None, as_json: bool
) -> None:
    """ms/token of plain and speculative decoding over N prompts, after warm-up."""
    set_threads(threads)
    prompts = [json.loads(line)["prompt"] for line in prompts_file.read_text().splitlines() if line.strip()]
    pipeline = load_with_status(config)
    for prompt in prompts[:warmup]:
        pipeline.plain(prompt, max_new_tokens=16)
        pipeline.speculative(prompt, max_new_tokens=16)
    rows = []
    with Progress(console=status_console, transient=True) as progress:
        task = progress.add_task("latency", total=min(nb_prompts, len(prompts)))
        for prompt in prompts[:nb_prompts]:
            p, s = pipeline.plain(prompt).result.stats, pipeline.speculative(prompt).result.stats
            rows.append(
                {
                    "plain_ms_per_token": p.ms_per_token,
                    "ssp_ms_per_token": s.ms_per_token,
                    "acceptance_rate": s.acceptance_rate,
                    "mean_accepted_length": s.mean_accepted_length,
                }
            )
            progress.advance(task)
    summary = {key: mean(r[key] for r in rows) for key in rows[0]}
    summary["speedup"] = summary["plain_ms_per_token"] / summary["ssp_ms_per_token"]
    if as_json:
        echo_json({"prompts": rows, "mean": summary})
        return
    table = titled_table(f"latency over {len(rows)} prompts | {describe(config)}")
    for name in ("prompt", "plain ms/token", "SSp ms/token", "speedup", "acceptance", "accepted len"):
        table.add_column(name, justify="right")
    for i, r in enumerate(rows, 1):
        table.add_row(
            str(i),
            f"{r['plain_ms_per_token']:.1f}",
            f"{r['ssp_ms_per_token']:.1f}",
            f"{r['plain_ms_per_token'] / r['ssp_ms_per_token']:.2f}x",
            f"{r['acceptance_rate']:.3f}",
            f"{r['mean_accepted_length']:.2f}",
        )
    table.add_row(
        "mean",
        f"{summary['plain_ms_per_token']:.1f}",
        f"{summary['ssp_ms_per_token']:.1f}",
        f"[bold]{summary['speedup']:.2f}x[/bold]",
        f"{summary['acceptance_rate']:.3f}",
        f"{summary['mean_accepted_length']:.2f}",
        style="bold",
    )
    console.print(table)
