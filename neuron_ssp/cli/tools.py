"""tune-k, eval and bench: pick k, check quality, and measure speed against Hugging Face.

Every speed figure is a ratio measured in one run with the runs interleaved per prompt; the machine it
ran on is printed with it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import click
import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from neuron_ssp.cli.generate import load_with_status, require_prompt
from neuron_ssp.cli.neuron import parse_ks
from neuron_ssp.cli.options import echo_json, with_config
from neuron_ssp.cli.options import set_threads as _set_threads
from neuron_ssp.cli.options import threads_option as _threads_option
from neuron_ssp.cli.report import console, describe, fit_fields, status_console
from neuron_ssp.cli.tools_report import (
    bench_json,
    bench_table,
    drafter_json,
    drafter_table,
    lossless_json,
    lossless_lines,
    math_json,
    math_table,
    math_verdict,
    per_prompt_json,
    repeated_json,
    repeated_table,
    tune_k_json,
    tune_k_table,
)
from neuron_ssp.config import Config, config_from_dict
from neuron_ssp.errors import Problem, UsageError
from neuron_ssp.tools.extra import scipy_stats
from neuron_ssp.tools.hf_baseline import HF_PROMPT_LOOKUP_TOKENS
from neuron_ssp.tools.machine import describe_machine, machine_info
from neuron_ssp.tools.prompt_set import DEFAULT_PROMPTS, HALVES, balanced, by_category, load_prompts
from neuron_ssp.tools.proportions import IntervalMethod

PROMPTS_HELP = "JSONL with a 'prompt' (and 'category') field per line (default: the Spec-Bench dev set)."


def _without_k_flag(func: Callable[..., Any]) -> Callable[..., Any]:
    """tune-k takes a range for --k, so the single-value --k of the shared options is dropped."""
    func.__click_params__ = [p for p in func.__click_params__ if p.name != "k"]  # type: ignore[attr-defined]
    return func


def _without_drafter_flag(func: Callable[..., Any]) -> Callable[..., Any]:
    """bench takes several drafters to compare, so the single-value --drafter of the shared options is dropped."""
    func.__click_params__ = [p for p in func.__click_params__ if p.name != "drafter"]  # type: ignore[attr-defined]
    return func


def _check_output(path: Path | None, option: str, suffix: str | None = None) -> None:
    """Fail before a long run, not after it."""
    if path is None:
        return
    if suffix and path.suffix.lower() != suffix:
        raise UsageError(Problem(option, str(path), f"the file must end in {suffix}", f"e.g. {option} out{suffix}"))
    if not path.parent.is_dir():
        raise UsageError(
            Problem(
                option, str(path), "the directory does not exist", f"create {path.parent} first or write somewhere else"
            )
        )


def _check_plot(path: Path | None) -> None:
    """A .png in an existing directory, and matplotlib installed: both known before the run, not after."""
    _check_output(path, "--plot", ".png")
    if path is not None:
        from neuron_ssp.tools.plots import figure_class

        figure_class()


@contextmanager
def _progress(label: str, total: int) -> Iterator[Callable[[str], None]]:
    """A rich progress bar on stderr (so --json stays clean); yields `step(description)`."""
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=status_console, transient=True) as progress:
        task = progress.add_task(label, total=total)

        def step(description: str = "") -> None:
            progress.update(task, advance=1, description=f"{label} {description}".strip())

        yield step


def _settings(config: Config, **more: Any) -> dict[str, Any]:
    s = config.speculation
    return {
        "model": config.target.path,
        "backend": config.platform.backend,
        "drafter": s.drafter,
        "k": s.k,
        "policy": s.policy,
        "acceptor": s.acceptor,
        "ngram_max": s.ngram_max,
        "ngram_min": s.ngram_min,
        "confidence_threshold": s.confidence_threshold,
        "temperature": config.sampling.temperature,
        "max_new_tokens": config.generation.max_new_tokens,
        **more,
    }


def _device(config: Config) -> str:
    if config.platform.backend == "neuron":
        return "neuron"
    return (
        "cuda"
        if config.platform.device == "cuda" or (config.platform.device == "auto" and torch.cuda.is_available())
        else "cpu"
    )


def _with_drafter(config: Config, name: str) -> Config:
    data = config.model_dump()
    data["speculation"]["drafter"] = name
    return config_from_dict(data)


# ---------------------------------------------------------------- tune-k


@click.command("tune-k")
@click.option(
    "--k",
    "ks_text",
    default="2..10",
    show_default=True,
    metavar="KS",
    help="Windows to try: a range (2..10), a list (2,4,6) or one value. The draft proposes k-1 tokens, "
    "the target scores k positions per call (gamma = k-1).",
)
@click.option("--prompts", "prompts_file", type=click.Path(path_type=Path), default=DEFAULT_PROMPTS, help=PROMPTS_HELP)
@click.option(
    "--nb-prompts",
    type=int,
    default=6,
    show_default=True,
    help="Prompts to measure, taken round-robin across categories.",
)
@click.option("--plot", "plot_path", type=click.Path(path_type=Path), help="Write speedup and α vs k to this PNG.")
@click.option(
    "--write",
    "write_path",
    type=click.Path(path_type=Path),
    help="Write the recommended k into this YAML config (comments kept).",
)
@click.option("--wide", is_flag=True, help="All columns (per-position acceptance, c, Leviathan); default fits 80.")
@_threads_option
@_without_k_flag
@with_config
def tune_k(
    config: Config,
    ks_text: str,
    prompts_file: Path,
    nb_prompts: int,
    plot_path: Path | None,
    write_path: Path | None,
    wide: bool,
    threads: int | None,
    as_json: bool,
) -> None:
    """Measure α, c and the speedup for each k, next to the Leviathan model's prediction; recommend k.

    The target's call cost per window width is timed once; "width model" predicts each k's speedup
    from it and the measured acceptance. On a Neuron config one compiled target holds every k: run
    `neuron-ssp compile CONFIG --k 2..10` first (with neuron.compiled_dir set); tune-k loads it once.
    """
    from neuron_ssp.tools.per_k import compiled_target_groups, shared_target_groups, with_k
    from neuron_ssp.tools.tune_k import tune_k as run_tune_k

    ks = parse_ks(ks_text, config.speculation.k)
    for k in ks:
        config_from_dict(with_k(config, k).model_dump())  # every k valid for this config, before any load
    _check_plot(plot_path)
    _check_output(write_path, "--write")
    if write_path is not None:
        from neuron_ssp.tools.config_edit import check_editable

        check_editable(write_path)  # a file that cannot take the new k is refused before the run
    prompts = balanced(load_prompts(prompts_file), nb_prompts)
    _set_threads(threads)
    neuron = config.platform.backend == "neuron"
    groups = compiled_target_groups(config, ks) if neuron else shared_target_groups(load_with_status(config), ks)
    with _progress("tune-k", len(ks) * len(prompts)) as step:
        result = run_tune_k(groups, prompts, config.generation.max_new_tokens, step)
    machine = machine_info(_device(config))
    title = (
        f"tune-k over {result.prompts} prompts, {result.max_new_tokens} new tokens | {describe(config)}\n"
        f"{describe_machine(machine)}"
    )
    written = None
    if write_path is not None:
        from neuron_ssp.tools.config_edit import write_k

        written = write_k(write_path, result.recommended_k, config)
    if plot_path is not None:
        from neuron_ssp.tools.plots import plot_tune_k

        plot_tune_k(result, plot_path, title)
    if as_json:
        echo_json(tune_k_json(result))
        return
    console.print(tune_k_table(result, title, show_setup=neuron, wide=wide))
    best = result.recommended_k
    console.print(
        f"recommended k = [bold]{best}[/bold] (the best measured speedup; a smaller k within 2% of it "
        "wins). τ = tokens per target call; call ms = one k-wide target call (median of calls timed "
        "per width after each prompt's runs); "
        "width model = both loops priced with those call times: (P + L₁·(t(1) + h₁)) ÷ (P + L_k·"
        "(E\\[t(width)] + h_k)) per token, P = prefill, L = target calls (from τ), h = host time per call; "
        "gap = measured/width model - 1. "
        "--wide adds the Leviathan predictions (a k-wide call priced like a one-token call)."
    )
    if neuron:
        for row in result.rows:
            console.print(f"k={row.k}: {row.setup.note}")
    if written:
        console.print(f"k={best} -> {write_path}: {written}")


# ---------------------------------------------------------------- eval


@click.command("eval")
@click.option("--nb-prompts", type=int, default=100, show_default=True, help="Multiplication problems to ask.")
@click.option(
    "--answer-tokens", type=click.IntRange(min=1), default=16, show_default=True, help="New tokens per answer."
)
@click.option(
    "--interval",
    type=click.Choice(["wilson", "clopper-pearson", "wald"]),
    default="wilson",
    show_default=True,
    help="95% interval for each accuracy (--json gives all three). Wald collapses to a point at 0/n and n/n.",
)
@click.option(
    "--lossless", is_flag=True, help="Instead: total-variation distance between SSp and plain next-token distributions."
)
@click.option("--samples", type=int, default=8000, show_default=True, help="--lossless: samples per method.")
@click.option(
    "--prompt",
    "lossless_prompt",
    help="--lossless: a prompt where the drafter proposes (one the answer copies from). Default: a copy task.",
)
@_threads_option
@with_config
def eval_command(
    config: Config,
    nb_prompts: int,
    answer_tokens: int,
    interval: str,
    lossless: bool,
    samples: int,
    lossless_prompt: str | None,
    threads: int | None,
    as_json: bool,
) -> None:
    """Quality: a×b (a, b in 1..99, from --seed) answered by plain sampling and by SSp, scored exactly.

    Each accuracy gets a 95% interval (Wilson by default; Clopper-Pearson or Wald with --interval); a
    pooled two-proportion z-test says whether they differ.
    With --lossless: the first two new tokens sampled --samples times from each, at temperature 1
    unless --temperature is given, compared by total-variation distance with a 95% upper bound.
    """
    scipy_stats()  # intervals, tests: the optional tools extra, checked before the model loads
    _set_threads(threads)
    if lossless:
        _eval_lossless(config, samples, lossless_prompt, as_json)
        return
    from neuron_ssp.tools.eval_math import make_problems, run_math_eval

    if nb_prompts < 1:
        raise UsageError(Problem("--nb-prompts", nb_prompts, "must be >= 1", "pass e.g. --nb-prompts 100"))
    problems = make_problems(config.sampling.seed, nb_prompts)
    pipeline = load_with_status(config)
    with _progress("eval", len(problems)) as step:
        result = run_math_eval(pipeline, problems, answer_tokens, lambda: step())
    if as_json:
        echo_json(
            {
                **math_json(result, config.sampling.seed, config.sampling.temperature),
                "machine": machine_info(_device(config)),
                "settings": _settings(config),
            }
        )
        return
    method = cast(IntervalMethod, interval)
    console.print(
        math_table(result, f"a×b, {len(problems)} problems, seed {config.sampling.seed} | {describe(config)}", method)
    )
    console.print(math_verdict(result, method))


def _eval_lossless(config: Config, samples: int, prompt: str | None, as_json: bool) -> None:
    from neuron_ssp.tools.lossless import DEFAULT_PROMPT, check_lossless

    prompt = DEFAULT_PROMPT if prompt is None else prompt
    require_prompt(prompt)
    temperature = config.sampling.temperature or 1.0
    pipeline = load_with_status(config)
    with _progress("lossless", samples) as step:
        report = check_lossless(pipeline, prompt, samples, temperature, config.sampling.seed, lambda: step())
    if as_json:
        echo_json(
            {
                **lossless_json(report, prompt),
                "machine": machine_info(_device(config)),
                "settings": _settings(config, temperature=temperature),
            }
        )
        return
    sampled = config.model_copy(update={"sampling": config.sampling.model_copy(update={"temperature": temperature})})
    console.print(f"[dim]{fit_fields(describe(sampled))}[/dim]")
    for line in lossless_lines(report):
        console.print(line)
    if report.drafted_share == 0:
        console.print(
            "[yellow]the target checked no draft on this prompt (the drafter found nothing to propose, or "
            "the window policy kept none of it), so the acceptor was not exercised: pass --prompt with "
            "text the answer copies from, or --policy fixed[/yellow]"
        )


# ---------------------------------------------------------------- bench


@click.command("bench")
@click.option(
    "--prompts",
    "prompts_files",
    type=click.Path(path_type=Path),
    multiple=True,
    help=f"{PROMPTS_HELP} Repeat to join several files, in order.",
)
@click.option(
    "--half",
    type=click.Choice(HALVES),
    help="Per category, only the prompts at even (choose) or odd (report) positions: choose settings "
    "on one half, report the other.",
)
@click.option("--categories", multiple=True, help="Only these categories (repeat or comma-separate).")
@click.option("--nb-prompts", type=int, help="Prompts per category (default: all).")
@click.option("--plot", "plot_path", type=click.Path(path_type=Path), help="Write speedups per category to this PNG.")
@click.option(
    "--hf-lookup-tokens",
    type=click.IntRange(min=1),
    default=HF_PROMPT_LOOKUP_TOKENS,
    show_default=True,
    help="prompt_lookup_num_tokens for Hugging Face's prompt lookup.",
)
@click.option("--no-hf", is_flag=True, help="Skip the Hugging Face generate() runs.")
@click.option(
    "--repeat",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Measure the whole prompt set this many times (a noisy machine needs more).",
)
@click.option(
    "--drafter",
    "drafters",
    multiple=True,
    help="Drafters to compare in one run, interleaved per prompt (repeat or comma-separate: "
    "--drafter ngram,suffix). Default: the config's drafter.",
)
@click.option(
    "--repeated-workload",
    is_flag=True,
    help="Run the prompt set three times through one pipeline: first (history fills as it goes), "
    "warm (drafting from the first pass's history), cold (history cleared). No Hugging Face runs.",
)
@_threads_option
@_without_drafter_flag
@with_config
def bench(
    config: Config,
    prompts_files: tuple[Path, ...],
    half: str | None,
    categories: tuple[str, ...],
    nb_prompts: int | None,
    plot_path: Path | None,
    hf_lookup_tokens: int,
    no_hf: bool,
    repeat: int,
    drafters: tuple[str, ...],
    repeated_workload: bool,
    threads: int | None,
    as_json: bool,
) -> None:
    """Spec-Bench method: greedy, batch 1, per category: our plain and SSp tokens/s next to HF generate().

    Per prompt: our plain decoding, our SSp (once per compared drafter), HF plain, HF prompt lookup
    (and HF assisted generation with a draft model), back to back. Greedy SSp output must equal plain
    output token for token.
    """
    from neuron_ssp.tools.bench import run_bench, run_repeated

    names = [d.strip() for group in drafters for d in group.split(",") if d.strip()]
    if names:  # the first one is the pipeline's own drafter; every name is checked as a config value
        config = _with_drafter(config, names[0])
        for name in names[1:]:
            _with_drafter(config, name)
    wanted = [c.strip() for group in categories for c in group.split(",") if c.strip()]
    loaded = [prompt for path in prompts_files or (DEFAULT_PROMPTS,) for prompt in load_prompts(path)]
    prompts = by_category(loaded, wanted, nb_prompts, half)
    _check_plot(plot_path)
    if config.sampling.temperature != 0:
        status_console.print(f"bench is greedy: temperature {config.sampling.temperature} -> 0")
        config = config.model_copy(update={"sampling": config.sampling.model_copy(update={"temperature": 0.0})})
    _set_threads(threads)
    pipeline = load_with_status(config)
    count = sum(len(group) for group in prompts.values())
    machine = machine_info(_device(config))
    if repeated_workload:
        with _progress("bench", 3 * count) as step:
            passes = run_repeated(pipeline, prompts, config.generation.max_new_tokens, step, names)
        if as_json:
            echo_json(
                {
                    "machine": machine,
                    "repeated": repeated_json(passes),
                    "per_prompt": {name: per_prompt_json(result) for name, result in passes.items()},
                }
            )
            return
        console.print(
            repeated_table(
                passes,
                f"bench --repeated-workload: greedy, "
                f"{config.generation.max_new_tokens} new tokens | {describe(config)}\n"
                f"{describe_machine(machine)}",
            )
        )
        console.print(
            "speedup = SSp tok/s ÷ plain tok/s of the same pass; first: history empty at the start, "
            "warm: the same prompts again with the first pass's history, cold: history cleared."
        )
        return
    hf_tokens = None if no_hf or config.platform.backend == "neuron" else hf_lookup_tokens
    with _progress("bench", repeat * count) as step:
        result = run_bench(pipeline, prompts, config.generation.max_new_tokens, hf_tokens, step, repeat, names)
    chosen = f", {half} half" if half else ""
    title = (
        f"bench: greedy, {result.max_new_tokens} new tokens, {repeat} pass(es){chosen} | {describe(config)}\n"
        f"{describe_machine(machine)}"
    )
    if len(result.drafters) > 1:
        if as_json:
            echo_json(
                {**bench_json(result, machine), "drafters": drafter_json(result), "per_prompt": per_prompt_json(result)}
            )
            return
        console.print(drafter_table(result, title))
        hf_note = (
            f"HF lookup = HF prompt lookup over HF plain (prompt_lookup_num_tokens={hf_tokens}); "
            if hf_tokens
            else "no Hugging Face runs; "
        )
        console.print(
            "each drafter's speedup = its SSp tok/s ÷ plain tok/s (same run, interleaved per prompt); "
            f"{hf_note}geomean over the categories."
        )
        return
    if plot_path is not None:
        from neuron_ssp.tools.plots import plot_bench

        plot_bench(result, plot_path, title)
    if as_json:
        echo_json(bench_json(result, machine))
        return
    console.print(bench_table(result, title))
    hf_note = (
        (
            "SSp ÷ HF = SSp tok/s ÷ HF generate() tok/s (same run, interleaved per prompt); HF lookup = HF "
            f"prompt lookup's speedup over HF plain (prompt_lookup_num_tokens={hf_tokens}); "
        )
        if hf_tokens
        else "no Hugging Face runs (--no-hf, or a Neuron backend); "
    )
    console.print(
        "speedup = SSp tok/s ÷ our plain tok/s (same run, interleaved per prompt); call cost = mean SSp "
        f"target call time ÷ mean plain one; {hf_note}geomean over the categories."
    )
    hf_equal = [m.hf_equal for m in result.overall.measures if m.hf_equal is not None]
    if hf_equal:
        console.print(f"HF greedy output equals our plain output on {sum(hf_equal)}/{len(hf_equal)} prompts.")
