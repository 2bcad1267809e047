"""Tables and JSON for tune-k, eval and bench: what the user reads, kept apart from what is measured."""

from __future__ import annotations

import math
from typing import Any

from rich.console import Group
from rich.table import Table

from neuron_ssp.cli.report import titled_table
from neuron_ssp.tools.bench import BenchResult, CategoryResult
from neuron_ssp.tools.eval_math import MathEval
from neuron_ssp.tools.lossless import LosslessReport
from neuron_ssp.tools.proportions import INTERVAL_METHODS, IntervalMethod, Proportion
from neuron_ssp.tools.tune_k import TuneKResult


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _positions(values: list[float | None]) -> str:
    return " ".join("-" if v is None else f"{v:.2f}" for v in values)


# ---------------------------------------------------------------- tune-k


def tune_k_json(result: TuneKResult) -> dict[str, Any]:
    """The documented shape, nothing more (the table shows per-position acceptance, ms/token, setup)."""
    return {
        "recommended_k": result.recommended_k,
        "rows": [
            {
                "k": r.k,
                "alpha": r.alpha,
                "c": r.c,
                "mean_accepted_length": r.mean_accepted_length,
                "speedup_measured": r.speedup_measured,
                "speedup_predicted": r.speedup_predicted,
                "speedup_width_model": r.speedup_width_model,
                "speedup_leviathan": r.speedup_leviathan,
            }
            for r in result.rows
        ],
        "call_ms_by_width": result.width_cost.ms if result.width_cost else None,
        "prefill_ms_mean": result.width_cost.mean_prefill_ms if result.width_cost else None,
    }


def tune_k_table(result: TuneKResult, title: str, show_setup: bool, wide: bool = False) -> Table:
    """Fits 80 columns by default (k, α, τ, ms/token, call ms, measured vs width-model speedup and gap);
    `wide` adds per-position acceptance, full drafts, c, the Leviathan predictions and setup times."""
    table = titled_table(title)
    names = ["k", "α", "τ", "ms/tok", "call ms", "speedup", "width model", "gap"]
    if wide:
        names += [
            "acceptance per position",
            "full drafts",
            "c",
            "plain ms/tok",
            "Leviathan (drafts)",
            "gap",
            "Leviathan (full)",
        ]
        names += ["compile / load s"] if show_setup else []
    for name in names:
        table.add_column(name, justify="right")
    cost = result.width_cost
    for r in result.rows:
        call = f"{cost.at(r.k):.1f}" if cost else "-"
        cells = [
            str(r.k),
            f"{r.alpha:.2f}",
            f"{r.mean_accepted_length:.2f}",
            f"{r.ms_per_token:.1f}",
            call,
            _x(r.speedup_measured),
            _x(r.speedup_width_model or None),
            f"{100 * r.width_model_gap:+.0f}%" if r.speedup_width_model else "-",
        ]
        if wide:
            cells += [
                _positions(r.per_position_acceptance),
                f"{r.full_draft_fraction:.2f}",
                f"{r.c:.4f}",
                f"{r.plain_ms_per_token:.1f}",
                _x(r.speedup_predicted),
                f"{100 * r.prediction_gap:+.0f}%",
                _x(r.speedup_leviathan),
            ]
            cells += [f"{r.setup.compile_s:.0f} / {r.setup.load_s:.0f}"] if show_setup else []
        table.add_row(*cells, style="bold green" if r.k == result.recommended_k else None)
    return table


# ---------------------------------------------------------------- eval

INTERVAL_NAMES = {"wald": "Wald", "wilson": "Wilson", "clopper-pearson": "Clopper-Pearson"}


def _proportion_json(p: Proportion) -> dict[str, Any]:
    intervals = {f"{method.replace('-', '_')}_95": list(p.interval(method)) for method in INTERVAL_METHODS}
    return {"correct": p.successes, "n": p.trials, "accuracy": p.value, **intervals}


def math_json(result: MathEval, seed: int, temperature: float) -> dict[str, Any]:
    test = result.test
    return {
        "seed": seed,
        "temperature": temperature,
        "problems": len(result.outcomes),
        "plain": _proportion_json(result.plain),
        "ssp": _proportion_json(result.ssp),
        "z_test": {"z": test.z, "p_value": test.p_value, "differ": test.differ()},
        "answers": [
            {"a": o.problem.a, "b": o.problem.b, "plain": o.plain_text, "ssp": o.ssp_text} for o in result.outcomes
        ],
    }


def math_table(result: MathEval, title: str, interval: IntervalMethod = "wilson") -> Table:
    table = titled_table(title)
    for name in ("", "correct", "accuracy", f"95% {INTERVAL_NAMES[interval]} interval"):
        table.add_column(name, justify="right")
    for name, p in (("plain sampling", result.plain), ("speculative sampling", result.ssp)):
        low, high = p.interval(interval)
        table.add_row(name, f"{p.successes}/{p.trials}", f"{p.value:.3f}", f"[{low:.3f}, {high:.3f}]")
    return table


def math_verdict(result: MathEval, interval: IntervalMethod = "wilson") -> str:
    test = result.test
    word = "DIFFER" if test.differ() else "do not differ"
    verdict = (
        f"two-proportion z-test (pooled): z = {test.z:.2f}, p = {test.p_value:.3f} -> the accuracies "
        f"{word} at the 5% level"
    )
    if interval == "wald" and any(p.successes in (0, p.trials) for p in (result.plain, result.ssp)):
        verdict += (
            "\nnote: Wald intervals collapse to a point at 0% or 100% correct; "
            "--interval wilson or clopper-pearson give a real bound there"
        )
    return verdict


def lossless_json(report: LosslessReport, prompt: str) -> dict[str, Any]:
    e = report.estimate
    return {
        "prompt": prompt,
        "samples": report.samples,
        "temperature": report.temperature,
        "tv": e.tv,
        "tv_upper_bound": e.upper_bound,
        "confidence": e.confidence,
        "null_tv_mean": e.null_tv_mean,
        "permutation_p_value": e.p_value,
        "drafted_share": report.drafted_share,
        "acceptance_rate": report.acceptance_rate,
        "distinct_pairs": report.distinct_pairs,
        "forward_passes": report.forward_passes,
        "top_pairs": [{"tokens": list(pair), "plain": a, "ssp": b} for pair, a, b in report.top_pairs],
    }


def lossless_lines(report: LosslessReport) -> list[str]:
    e = report.estimate
    return [
        f"first two new tokens, {report.samples} samples each, temperature {report.temperature}: "
        f"{report.distinct_pairs} distinct pairs, {report.forward_passes} forward passes",
        f"SSp drafted on {100 * report.drafted_share:.0f}% of samples (acceptance {report.acceptance_rate:.2f})",
        f"TV(SSp, plain) = {e.tv:.4f}; TV <= {e.upper_bound:.4f} with {100 * e.confidence:.0f}% confidence "
        "(McDiarmid bound)",
        f"equal distributions give TV ~ {e.null_tv_mean:.4f} at these sample sizes; permutation p = {e.p_value:.3f} "
        f"-> {'a difference is detected' if e.p_value < 0.05 else 'no difference detected'}",
    ]


# ---------------------------------------------------------------- bench


def bench_json(result: BenchResult, machine: dict[str, Any]) -> dict[str, Any]:
    """The documented shape, nothing more (the table adds the prediction and the all-prompts row)."""
    return {"machine": machine, "categories": {c.category: c.summary() for c in result.categories}}


def bench_table(result: BenchResult, title: str) -> Group:
    """Two tables of at most eight short columns (speed; acceptance and costs), so each reads at 80
    characters; --json has every figure."""
    rows = [*result.categories, result.overall]
    speed = titled_table(title)
    for name in ("category", "prompts", "plain tok/s", "SSp tok/s", "speedup", "SSp ÷ HF", "HF lookup"):
        speed.add_column(name, justify="right")
    for c in rows:
        speed.add_row(
            c.category,
            str(c.summary()["prompts"]),
            f"{c.plain_tok_s:.1f}",
            f"{c.ssp_tok_s:.1f}",
            _x(c.fit.speedup_measured),
            _x(c.ssp_vs_hf_plain),
            _x(c.hf_speedup("hf_lookup")),
            style="bold" if c is result.overall else None,
        )
    speed.add_row(
        "geomean",
        "",
        "",
        "",
        _x(_geomean_of([c.fit.speedup_measured for c in result.categories])),
        _x(_geomean_of([c.ssp_vs_hf_plain for c in result.categories])),
        _x(_geomean_of([c.hf_speedup("hf_lookup") for c in result.categories])),
        style="bold",
    )
    assisted = bool(result.categories) and result.categories[0].hf_speedup("hf_assisted") is not None
    costs = Table()
    for name in (
        "category",
        "α",
        "accepted len",
        "call cost",
        "HF tok/s",
        "plain ÷ HF",
        *(["HF assisted"] if assisted else []),
        "SSp = plain",
    ):
        costs.add_column(name, justify="right")
    for c in rows:
        costs.add_row(*_cost_cells(c, assisted), style="bold" if c is result.overall else None)
    return Group(speed, costs)


def _cost_cells(c: CategoryResult, assisted: bool) -> list[str]:
    hf_plain = c.hf_tok_s("hf_plain")
    equal = sum(m.outputs_equal for m in c.measures)
    call_cost = c.fit.ssp_call_ms / c.fit.plain_call_ms if c.fit.plain_call_ms else None
    return [
        c.category,
        f"{c.fit.alpha:.3f}",
        f"{c.fit.mean_accepted_length:.2f}",
        _x(call_cost),
        "-" if hf_plain is None else f"{hf_plain:.1f}",
        _x(c.plain_vs_hf_plain),
        *([_x(c.hf_speedup("hf_assisted"))] if assisted else []),
        f"{equal}/{len(c.measures)}",
    ]


# ---------------------------------------------------------------- bench: drafters side by side


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values and min(values) > 0 else 0.0


def _geomean_of(values: list[float | None]) -> float | None:
    """The geomean over the categories; None when any is missing (no Hugging Face runs)."""
    return None if not values or None in values else geomean([v for v in values if v is not None])


def drafter_table(result: BenchResult, title: str) -> Group:
    """Per category, in two tables that each read at 80 characters: speed (plain tok/s, each drafter's
    speedup, HF prompt lookup's) and acceptance (each drafter's α and accepted length)."""
    rows = [*result.categories, result.overall]
    speed = titled_table(title)
    acceptance = Table()
    for name in ("category", "plain tok/s", *result.drafters, "HF lookup", "= plain"):
        speed.add_column(name, justify="right")
    acceptance.add_column("category", justify="right")
    for name in result.drafters:
        acceptance.add_column(f"{name} α", justify="right")
        acceptance.add_column(f"{name} acc len", justify="right")
    for c in rows:
        style = "bold" if c is result.overall else None
        fits = [c.drafter_fit(name) for name in result.drafters]
        speed.add_row(
            c.category,
            f"{c.plain_tok_s:.1f}",
            *[_x(fit.speedup_measured) for fit in fits],
            _x(c.hf_speedup("hf_lookup")),
            " ".join(f"{c.drafter_equal(name)}/{len(c.measures)}" for name in result.drafters),
            style=style,
        )
        acceptance.add_row(
            c.category,
            *[cell for fit in fits for cell in (f"{fit.alpha:.3f}", f"{fit.mean_accepted_length:.2f}")],
            style=style,
        )
    speed.add_row(
        "geomean",
        "",
        *[_x(geomean([c.drafter_fit(name).speedup_measured for c in result.categories])) for name in result.drafters],
        _x(_geomean_of([c.hf_speedup("hf_lookup") for c in result.categories])),
        "",
        style="bold",
    )
    return Group(speed, acceptance)


def _run_json(stats: Any) -> dict[str, Any]:
    return {
        "new_tokens": stats.new_tokens,
        "wall_s": stats.wall_s,
        "target_calls": stats.target_calls,
        "loop_tokens": stats.loop_tokens,
        "draft_tokens": stats.draft_tokens,
        "accepted_tokens": stats.accepted_tokens,
    }


def per_prompt_json(result: BenchResult) -> list[dict[str, Any]]:
    """Raw counts per prompt run, so a subset (e.g. the half not used to choose a config) can be re-aggregated."""
    rows = []
    for c in result.categories:
        seen: dict[str, int] = {}
        for m in c.measures:
            position = seen.setdefault(m.prompt.text, len(seen))
            rows.append(
                {
                    "category": c.category,
                    "position": position,
                    "plain": _run_json(m.plain),
                    "drafters": {
                        name: {**_run_json(run.stats), "outputs_equal": run.outputs_equal}
                        for name, run in m.drafters.items()
                    },
                }
            )
    return rows


def drafter_json(result: BenchResult) -> dict[str, Any]:
    return {
        name: {
            "geomean_speedup": geomean([c.drafter_fit(name).speedup_measured for c in result.categories]),
            "categories": {
                c.category: {
                    "speedup": c.drafter_fit(name).speedup_measured,
                    "acceptance_rate": c.drafter_fit(name).alpha,
                    "mean_accepted_length": c.drafter_fit(name).mean_accepted_length,
                    "outputs_equal": c.drafter_equal(name) == len(c.measures),
                }
                for c in result.categories
            },
        }
        for name in result.drafters
    }


def repeated_table(passes: dict[str, BenchResult], title: str) -> Group:
    """The repeated workload: one table per drafter (so each reads at 80 characters), its speedup per pass
    (first, warm, cold) per category, and what the warm pass accepted."""
    groups = {pass_name: [*result.categories, result.overall] for pass_name, result in passes.items()}
    categories = [c.category for c in groups["warm"]]  # the same rows, in the same order, in every pass
    tables = []
    for n, name in enumerate(passes["warm"].drafters):
        table = titled_table(f"{title}\ndrafter {name}" if n == 0 else f"drafter {name}")
        for column in ("category", *passes, "warm α", "warm acc len", "= plain"):
            table.add_column(column, justify="right")
        for i, category in enumerate(categories):
            warm = groups["warm"][i].drafter_fit(name)
            equal = sum(groups[p][i].drafter_equal(name) for p in passes)
            total = sum(len(groups[p][i].measures) for p in passes)
            table.add_row(
                category,
                *[_x(groups[p][i].drafter_fit(name).speedup_measured) for p in passes],
                f"{warm.alpha:.3f}",
                f"{warm.mean_accepted_length:.2f}",
                f"{equal}/{total}",
                style="bold" if i == len(categories) - 1 else None,
            )
        table.add_row(
            "geomean",
            *[
                _x(geomean([c.drafter_fit(name).speedup_measured for c in result.categories]))
                for result in passes.values()
            ],
            "",
            "",
            "",
            style="bold",
        )
        tables.append(table)
    return Group(*tables)


def repeated_json(passes: dict[str, BenchResult]) -> dict[str, Any]:
    return {pass_name: drafter_json(result) for pass_name, result in passes.items()}
