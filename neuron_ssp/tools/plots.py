"""PNG plots for tune-k, bench and bench-serve --sweep.

Figures are built with `matplotlib.figure.Figure`, not pyplot: no display is needed, and importing this
module never switches the backend of a notebook or script that also draws inline. matplotlib comes with
the optional tools extra, so it is imported when a figure is drawn.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from neuron_ssp.errors import Problem, UsageError
from neuron_ssp.tools.bench import BenchResult
from neuron_ssp.tools.extra import import_extra
from neuron_ssp.tools.serve_sweep import MODES, SweepResult
from neuron_ssp.tools.tune_k import TuneKResult

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def figure_class() -> type[Figure]:
    """matplotlib's Figure (the CLI calls this before a run whose end is a plot)."""
    return import_extra("matplotlib.figure", "--plot").Figure


def plot_tune_k(result: TuneKResult, path: Path, title: str) -> None:
    ks = [row.k for row in result.rows]
    fig = figure_class()(figsize=(10, 4))
    speed, accept = fig.subplots(1, 2)
    speed.plot(ks, [r.speedup_measured for r in result.rows], "o-", label="measured")
    speed.plot(ks, [r.speedup_width_model for r in result.rows], "s--", label="width model (call cost per width)")
    speed.plot(ks, [r.speedup_predicted for r in result.rows], "^:", label="Leviathan (measured draft lengths)")
    speed.plot(ks, [r.speedup_leviathan for r in result.rows], ":", color="grey", label="Leviathan, full drafts")
    speed.axhline(1.0, color="black", linewidth=0.8)
    speed.axvline(result.recommended_k, color="green", linewidth=0.8, linestyle="--", label="recommended k")
    speed.set(xlabel="k (window; k-1 drafted tokens)", ylabel="speedup over plain decoding", title="speedup")
    speed.legend(fontsize=8)
    accept.plot(ks, [r.alpha for r in result.rows], "o-", label="acceptance rate α")
    accept.plot(ks, [r.full_draft_fraction for r in result.rows], "^--", label="share of full drafts")
    accept.set(xlabel="k", ylim=(0, 1.05), title="acceptance")
    accept.legend(fontsize=8)
    _save(fig, path, title)


def plot_bench(result: BenchResult, path: Path, title: str) -> None:
    groups = [*result.categories, result.overall]
    names = [g.category for g in groups]
    series = [
        ("ours (SSp)", [g.fit.speedup_measured for g in groups]),
        ("ours, predicted", [g.fit.speedup_predicted for g in groups]),
    ]
    if all(g.hf_speedup("hf_lookup") is not None for g in groups):
        series.append(("HF prompt lookup", [g.hf_speedup("hf_lookup") for g in groups]))
    if all(g.hf_speedup("hf_assisted") is not None for g in groups):
        series.append(("HF assisted", [g.hf_speedup("hf_assisted") for g in groups]))
    fig = figure_class()(figsize=(max(8, 1.4 * len(names)), 4.5))
    ax = fig.subplots()
    width = 0.8 / len(series)
    for i, (label, values) in enumerate(series):
        positions = [x + (i - (len(series) - 1) / 2) * width for x in range(len(names))]
        bars = ax.bar(positions, values, width, label=label)
        ax.bar_label(bars, fmt="%.2f", fontsize=7)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(names)), names, rotation=20)
    ax.set(ylabel="speedup over plain decoding (same run)", title="speedup per category")
    ax.legend(fontsize=8)
    _save(fig, path, title)


def plot_sweep(result: SweepResult, path: Path, title: str) -> None:
    """Tokens/s, the servers' CPU time per output token and time per output token (p95) against concurrency,
    one line per way of serving."""
    fig = figure_class()(figsize=(14, 4))
    speed, cpu, latency = fig.subplots(1, 3)
    for mode in MODES:
        levels = sorted(result.runs[mode])
        runs = [result.runs[mode][c] for c in levels]
        speed.plot(levels, [run["output_tokens_per_s"] for run in runs], "o-", label=mode)
        timed = [(c, run["cpu_ms_per_token"]) for c, run in zip(levels, runs, strict=True) if run["cpu_ms_per_token"]]
        cpu.plot([c for c, _ in timed], [ms for _, ms in timed], "o-", label=mode)
        latency.plot(levels, [1000 * run["tpot_p95_s"] for run in runs], "o-", label=mode)
    for ax, label in (
        (speed, "output tokens/s (all clients)"),
        (cpu, "server CPU time per output token (ms)"),
        (latency, "time per output token, p95 (ms)"),
    ):
        ax.set_xscale("log", base=2)
        ax.set(xlabel="concurrent streaming clients", ylabel=label)
        ax.grid(alpha=0.3)
    speed.legend(fontsize=8)
    _save(fig, path, title)


def _save(fig: Figure, path: Path, title: str) -> None:
    fig.suptitle(title, fontsize=8)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=120)
    except OSError as exc:
        raise UsageError(
            Problem(
                "--plot", str(path), f"cannot write the plot ({exc.strerror})", "pass a writable path ending in .png"
            )
        ) from None
