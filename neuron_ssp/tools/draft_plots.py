"""PNG plots of draft-head training: loss and per-step accuracy against steps, and the learning curve."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from neuron_ssp.tools.plots import _save, figure_class
from neuron_ssp.tools.train_draft import History


def running_mean(values: list[float], window: int) -> list[float]:
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def plot_training(history: History, path: Path, title: str) -> None:
    """Training loss (step 1) and accuracy per training-time-test step, smoothed; held-out evaluations as dots."""
    fig = figure_class()(figsize=(11, 4))
    loss_ax, acc_ax = fig.subplots(1, 2)
    window = max(1, len(history.steps) // 50)
    steps = len(history.loss[0]) if history.loss else 0
    for i in range(steps):
        loss_ax.plot(history.steps, running_mean([row[i] for row in history.loss], window), label=f"step {i + 1}")
        acc_ax.plot(history.steps, running_mean([row[i] for row in history.accuracy], window), label=f"step {i + 1}")
    for i in range(min(steps, 4)):
        points = [(e["step"], e["accuracy"][i]) for e in history.evaluations]
        if points:
            acc_ax.plot(*zip(*points, strict=True), "o", color=f"C{i}", markersize=4)
    loss_ax.set(xlabel="optimizer step", ylabel="soft cross-entropy (train)", title="loss")
    acc_ax.set(xlabel="optimizer step", ylabel="top-1 = target argmax", ylim=(0, 1), title="accuracy (dots: held out)")
    acc_ax.legend(fontsize=7, ncol=2)
    _save(fig, path, title)


def init_label(settings: dict[str, Any]) -> str:
    """How a head's weights started (train-draft's recipe settings): the curve draws one line per start."""
    if settings.get("init_layer") is not None:
        return f"init from layer {settings['init_layer']}"
    if settings.get("init_lm_head"):
        return "lm-head init"
    return "random init"


def curve_series(points: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The curve's points grouped by their label, each group in order of training tokens."""
    series: dict[str, list[dict[str, Any]]] = {}
    for point in sorted(points, key=lambda p: p["train_tokens"]):
        series.setdefault(point["label"], []).append(point)
    return series


def plot_curve(points: list[dict[str, Any]], path: Path, title: str) -> None:
    """The learning curve: held-out tau at the longest chain (one line per start, prompt lookup dashed) and
    step-1 accuracy against training tokens."""
    fig = figure_class()(figsize=(11, 4))
    tau_ax, acc_ax = fig.subplots(1, 2)
    k = max(points[0]["tau"], key=int)
    for i, (label, group) in enumerate(curve_series(points).items()):
        tokens = [p["train_tokens"] for p in group]
        tau_ax.plot(tokens, [p["tau"][k] for p in group], "o-", color=f"C{i}", label=f"head, {label}")
        for step in range(len(group[0]["accuracy"])):
            acc_ax.plot(
                tokens,
                [p["accuracy"][step] for p in group],
                "os^v"[step % 4] + "-",
                color=f"C{i}",
                alpha=1.0 - 0.2 * step,
                label=f"{label}, step {step + 1}",
            )
    tau_ax.axhline(points[-1]["ngram_tau"][k], color="grey", linestyle="--", label=f"prompt lookup, k={k}")
    tau_ax.set(xscale="log", xlabel="training tokens", ylabel=f"tau at k={k} (tokens per target call)")
    tau_ax.set_title("held-out tau")
    tau_ax.legend(fontsize=7)
    acc_ax.set(xscale="log", xlabel="training tokens", ylabel="top-1 = target argmax", ylim=(0, 1), title="per step")
    acc_ax.legend(fontsize=6, ncol=2)
    _save(fig, path, title)
