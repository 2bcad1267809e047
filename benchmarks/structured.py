"""Structured output inside speculation, on the embedded model, in ONE run (issue 47, section 6).

The tasks (benchmarks/structured_tasks.jsonl, written for this benchmark): fields extracted from a passage into a
JSON schema, tool calls whose arguments come from the user's turn (the call's JSON as a json_schema grammar), JSON
answers to questions; 9 of each. Halves per category: even positions choose, odd positions report.

Per task, greedy, interleaved in each round: constrained plain decoding (drafter none), constrained speculation with
the grammar's forced tokens drafted, and without them (`speculation.grammar_forced_drafts`); CPU time of the process
(torch on one thread) beside wall time, since other work loads this machine. Greedy outputs of the three are the
same tokens (checked), so a time ratio is a speed ratio. Also: whether each output parses and validates against its
schema, the CPU time inside the row's processors (grammar masks, forced tokens, cuts, commits) as a share of the
speculative run's, and grammar compilations: each schema compiles at its first request, never again.

The choose half picks `grammar_forced_drafts` (the faster setting there, by CPU time); the report half reports every
target with it, once.

    python benchmarks/structured.py [--rounds 2] [--max-tokens 160] [--plot docs/structured.png]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from pathlib import Path

import jsonschema
import torch
from rich.progress import Progress

from neuron_ssp.config import Config, load_config
from neuron_ssp.pipeline.build import build_generator, share
from neuron_ssp.pipeline.load import load_pipeline
from neuron_ssp.pipeline.pipeline import Pipeline
from neuron_ssp.speculation.controls import Grammar, RequestControls
from neuron_ssp.speculation.processors import RowProcessor

TASKS = Path(__file__).parent / "structured_tasks.jsonl"
METHODS = ("plain", "forced", "unforced")


def halves(tasks: list[dict]) -> dict[str, list[dict]]:
    """Per category, even positions choose and odd positions report."""
    split: dict[str, list[dict]] = {"choose": [], "report": []}
    for category in sorted({task["category"] for task in tasks}):
        group = [task for task in tasks if task["category"] == category]
        for i, task in enumerate(group):
            split["choose" if i % 2 == 0 else "report"].append(task)
    return split


def sibling(pipeline: Pipeline, config: Config) -> Pipeline:
    """A pipeline over the same loaded target and tokenizer with another speculation config, and the same compiled
    grammars (so a schema compiled for one request is compiled for all)."""
    shared = share(config, pipeline.target, None, cost=pipeline.shared.cost)
    other = Pipeline(
        config,
        pipeline.tokenizer,
        pipeline.target,
        None,
        build_generator(config, pipeline.target, None, shared),
        pipeline.eos_token_ids,
        shared,
    )
    other.__dict__["grammars"] = pipeline.grammars
    return other


class ProcessorClock:
    """CPU seconds spent in every row's processors (grammar masks along the path, forced tokens, cuts, commits)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        for name in ("process", "valid_prefix", "forced", "commit"):
            original = getattr(RowProcessor, name)
            setattr(RowProcessor, name, self._timed(original))

    def _timed(self, original):
        clock = self

        def timed(*args, **kwargs):
            begin = time.process_time()
            try:
                return original(*args, **kwargs)
            finally:
                clock.seconds += time.process_time() - begin

        return timed


def run(pipeline: Pipeline, ids: torch.Tensor, max_tokens: int, controls: RequestControls, clock: ProcessorClock):
    """One request: its tokens, wall and CPU seconds, the processors' CPU seconds, target calls."""
    before = clock.seconds
    wall, cpu = time.perf_counter(), time.process_time()
    result = pipeline.generate_ids(ids, max_tokens, controls=controls)
    return {
        "tokens": result.tokens,
        "wall_s": time.perf_counter() - wall,
        "cpu_s": time.process_time() - cpu,
        "processor_s": clock.seconds - before,
        "calls": result.stats.target_calls,
    }


def schema_valid(pipeline: Pipeline, tokens: list[int], schema: dict) -> bool:
    try:
        jsonschema.validate(json.loads(pipeline.tokenizer.decode(tokens, skip_special_tokens=True)), schema)
    except (json.JSONDecodeError, jsonschema.ValidationError):
        return False
    return True


def geomean(values: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values))


def measure(pipelines: dict[str, Pipeline], tasks: list[dict], rounds: int, max_tokens: int, progress) -> list[dict]:
    clock = ProcessorClock()
    grammars = pipelines["plain"].grammars
    rows = []
    bar = progress.add_task("structured tasks", total=len(tasks) * rounds * len(METHODS))
    for task in tasks:
        controls = RequestControls(grammar=Grammar("json_schema", json.dumps(task["schema"]), "response_format"))
        ids = pipelines["plain"].encode(task["prompt"])
        compiles = grammars.compiler.compiles
        begin = time.perf_counter()
        problems = pipelines["plain"].controls_problems(controls)  # the first request with this schema compiles it
        compile_ms = (time.perf_counter() - begin) * 1000
        assert not problems, problems
        first_compiles = grammars.compiler.compiles - compiles
        runs: dict[str, list[dict]] = {method: [] for method in METHODS}
        for _ in range(rounds):
            for method in METHODS:
                runs[method].append(run(pipelines[method], ids, max_tokens, controls, clock))
                progress.advance(bar)
        outputs = {method: runs[method][0]["tokens"] for method in METHODS}
        rows.append(
            {
                "id": task["id"],
                "category": task["category"],
                "tokens": len(outputs["plain"]),
                "same_tokens": outputs["plain"] == outputs["forced"] == outputs["unforced"],
                "valid": schema_valid(pipelines["plain"], outputs["plain"], task["schema"]),
                "first_compiles": first_compiles,
                "later_compiles": grammars.compiler.compiles - compiles - first_compiles,
                "compile_ms": compile_ms,
                **{
                    f"{method}_{what}": statistics.median(r[what] for r in runs[method])
                    for method in METHODS
                    for what in ("wall_s", "cpu_s", "processor_s", "calls")
                },
            }
        )
    return rows


def summary(rows: list[dict], forced: bool) -> dict[str, float]:
    ssp = "forced" if forced else "unforced"
    return {
        "tasks": len(rows),
        "schema_valid": sum(r["valid"] for r in rows) / len(rows),
        "same_tokens": sum(r["same_tokens"] for r in rows),
        "ssp_vs_plain_cpu": geomean([r["plain_cpu_s"] / r[f"{ssp}_cpu_s"] for r in rows]),
        "ssp_vs_plain_wall": geomean([r["plain_wall_s"] / r[f"{ssp}_wall_s"] for r in rows]),
        "forced_vs_unforced_cpu": geomean([r["unforced_cpu_s"] / r["forced_cpu_s"] for r in rows]),
        "forced_vs_unforced_wall": geomean([r["unforced_wall_s"] / r["forced_wall_s"] for r in rows]),
        "processor_share": sum(r[f"{ssp}_processor_s"] for r in rows) / sum(r[f"{ssp}_cpu_s"] for r in rows),
        "tokens_per_call_plain": sum(r["tokens"] for r in rows) / sum(r["plain_calls"] for r in rows),
        "tokens_per_call_ssp": sum(r["tokens"] for r in rows) / sum(r[f"{ssp}_calls"] for r in rows),
        "later_compiles": sum(r["later_compiles"] for r in rows),
        "compile_ms_median": statistics.median(r["compile_ms"] for r in rows),
    }


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['category'][:4]} {r['id']}" for r in rows]
    x = range(len(rows))
    fig, ax = plt.subplots(figsize=(12, 4))
    ax.bar([i - 0.2 for i in x], [r["plain_cpu_s"] / r["forced_cpu_s"] for r in rows], 0.4, label="forced drafts")
    ax.bar([i + 0.2 for i in x], [r["plain_cpu_s"] / r["unforced_cpu_s"] for r in rows], 0.4, label="without")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xticks(list(x), labels, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("constrained SSp / constrained plain (CPU time)")
    ax.set_title("Structured output on the embedded model, greedy, per task (both halves)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--plot", default=None)
    parser.add_argument("--json", default=None, help="write every task's measurements here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    base = load_config(None)
    pipelines = {"forced": load_pipeline(base)}
    pipelines["unforced"] = sibling(
        pipelines["forced"],
        base.model_copy(update={"speculation": base.speculation.model_copy(update={"grammar_forced_drafts": False})}),
    )
    pipelines["plain"] = sibling(
        pipelines["forced"],
        base.model_copy(update={"speculation": base.speculation.model_copy(update={"drafter": "none"})}),
    )
    tasks = [json.loads(line) for line in TASKS.read_text().splitlines() if line.strip()]
    split = halves(tasks)
    with Progress() as progress:
        measured = {half: measure(pipelines, split[half], args.rounds, args.max_tokens, progress) for half in split}
    choose = summary(measured["choose"], forced=True)
    forced = choose["forced_vs_unforced_cpu"] >= 1.0
    print(
        f"choose half ({len(split['choose'])} tasks): forced drafts / without, CPU "
        f"{choose['forced_vs_unforced_cpu']:.3f}x -> grammar_forced_drafts: {str(forced).lower()}"
    )
    report = summary(measured["report"], forced=forced)
    print(f"report half ({len(split['report'])} tasks), grammar_forced_drafts {str(forced).lower()}:")
    for name, value in report.items():
        print(f"  {name}: {value:.4f}" if isinstance(value, float) else f"  {name}: {value}")
    print(
        "targets: schema-valid 100 %; SSp / plain >= 1.8x; forced / without >= 1.15x; processors <= 3 % of CPU; "
        "0 later compiles"
    )
    for half, rows in measured.items():
        for r in rows:
            print(
                f"  {half} task {r['id']:2d} {r['category']:11s} {r['tokens']:3d} tokens valid {r['valid']!s:5s} "
                f"same {r['same_tokens']!s:5s} plain {r['plain_cpu_s']:.3f}s forced {r['forced_cpu_s']:.3f}s "
                f"unforced {r['unforced_cpu_s']:.3f}s "
                f"calls {r['plain_calls']}/{r['forced_calls']}/{r['unforced_calls']}"
            )
    if args.json:
        Path(args.json).write_text(json.dumps({"choose": choose, "report": report, "tasks": measured}, indent=1))
    if args.plot:
        plot(measured["choose"] + measured["report"], args.plot)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
