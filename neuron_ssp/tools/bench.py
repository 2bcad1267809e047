"""Spec-Bench-style speed benchmark: greedy, batch 1, per category, against Hugging Face's generate().

Per prompt, four runs back to back on the same model: our plain decoding, our SSp, HF plain, HF prompt
lookup (and HF assisted generation when a draft model is configured). The order of the four rotates from
one prompt to the next, so no method always runs first after a prompt switch, and prompts are taken
round-robin across categories, so a burst of load on a shared machine hits every method and category
alike. `repeat` measures the whole set several times over. Greedy SSp must reproduce plain decoding
token for token; `outputs_equal` checks it on every prompt.

`drafters` compares several drafters in the same run: each gets its own SSp run per prompt, in the
rotation with the others. A drafter that learns across requests (suffix) sees the earlier prompts of
the same pass, never the prompt it is measured on: its history is cleared after the warm-up and at
the start of every pass. `run_repeated` is the repeated workload: the prompt set twice through one
pipeline (the second pass drafts from the first pass's history), then once more after clearing it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from neuron_ssp.config import config_from_dict
from neuron_ssp.drafters.suffix import SuffixDrafter
from neuron_ssp.engines.native import plain_generate
from neuron_ssp.engines.rows import Generator
from neuron_ssp.errors import Problem, UsageError
from neuron_ssp.pipeline.build import Shared, build_generator, share
from neuron_ssp.pipeline.pipeline import Pipeline
from neuron_ssp.speculation.stats import GenerationStats, merge_stats
from neuron_ssp.tools.hf_baseline import HfRun, hf_generate, hf_model
from neuron_ssp.tools.per_k import KSetup
from neuron_ssp.tools.prompt_set import BenchPrompt
from neuron_ssp.tools.tune_k import KRow, k_row

WARMUP_TOKENS = 16
ALL = "all"
PASSES = ("first", "warm", "cold")  # run_repeated: empty history, the first pass's history, cleared again


@dataclass
class DrafterRun:
    stats: GenerationStats
    outputs_equal: bool  # this drafter's SSp tokens == our plain tokens


@dataclass
class PromptMeasure:
    prompt: BenchPrompt
    plain: GenerationStats
    ssp: GenerationStats  # the first (or only) drafter's run
    outputs_equal: bool  # SSp tokens == our plain tokens
    hf_plain: HfRun | None = None
    hf_lookup: HfRun | None = None
    hf_assisted: HfRun | None = None
    hf_equal: bool | None = None  # HF greedy tokens == our plain tokens (same model, same decoding)
    drafters: dict[str, DrafterRun] = field(default_factory=dict)  # every compared drafter, the first included


@dataclass
class CategoryResult:
    category: str
    measures: list[PromptMeasure]
    fit: KRow  # α, c, mean accepted length, measured and Leviathan-predicted speedup

    @property
    def plain_tok_s(self) -> float:
        return merge_stats([m.plain for m in self.measures]).tokens_per_s

    @property
    def ssp_tok_s(self) -> float:
        return merge_stats([m.ssp for m in self.measures]).tokens_per_s

    @property
    def outputs_equal(self) -> bool:
        return all(m.outputs_equal for m in self.measures)

    def hf_tok_s(self, which: str) -> float | None:
        runs = [getattr(m, which) for m in self.measures]
        if any(run is None for run in runs):
            return None
        wall = sum(run.wall_s for run in runs)
        return sum(len(run.tokens) for run in runs) / wall if wall else 0.0

    def hf_speedup(self, which: str) -> float | None:
        plain, other = self.hf_tok_s("hf_plain"), self.hf_tok_s(which)
        return other / plain if plain and other is not None else None

    def summary(self) -> dict[str, Any]:
        """The `bench --json` entry for this category."""
        return {
            "prompts": len({m.prompt for m in self.measures}),
            "plain_tok_s": self.plain_tok_s,
            "ssp_tok_s": self.ssp_tok_s,
            "speedup": self.fit.speedup_measured,
            "hf_plain_tok_s": self.hf_tok_s("hf_plain"),
            "ssp_vs_hf_plain": self.ssp_vs_hf_plain,
            "hf_prompt_lookup_speedup": self.hf_speedup("hf_lookup"),
            "mean_accepted_length": self.fit.mean_accepted_length,
            "acceptance_rate": self.fit.alpha,
            "outputs_equal": self.outputs_equal,
        }

    def drafter_fit(self, name: str) -> KRow:
        """α, accepted length and speedup of one compared drafter over the same plain runs."""
        return k_row(
            self.fit.k, [m.plain for m in self.measures], [m.drafters[name].stats for m in self.measures], KSetup()
        )

    def drafter_equal(self, name: str) -> int:
        """Prompts on which this drafter's greedy output equalled plain decoding."""
        return sum(m.drafters[name].outputs_equal for m in self.measures)

    @property
    def plain_vs_hf_plain(self) -> float | None:
        """Our plain tokens/s over HF generate()'s: what our decoding loop costs or saves."""
        hf = self.hf_tok_s("hf_plain")
        return self.plain_tok_s / hf if hf else None

    @property
    def ssp_vs_hf_plain(self) -> float | None:
        """Our SSp tokens/s over HF generate()'s: the speedup a user of HF generate() gets by switching."""
        hf = self.hf_tok_s("hf_plain")
        return self.ssp_tok_s / hf if hf else None


@dataclass
class BenchResult:
    categories: list[CategoryResult]
    overall: CategoryResult
    max_new_tokens: int
    drafters: list[str] = field(default_factory=list)  # compared drafters, in column order


def run_bench(
    pipeline: Pipeline,
    prompts: dict[str, list[BenchPrompt]],
    max_new_tokens: int,
    hf_lookup_tokens: int | None,
    on_step: Callable[[str], None] | None = None,
    repeat: int = 1,
    drafters: Sequence[str] = (),
) -> BenchResult:
    """Measure every prompt four ways, `repeat` times; `hf_lookup_tokens` None skips the Hugging Face runs."""
    runner = _Runner(pipeline, hf_lookup_tokens, drafters)
    order = _round_robin(prompts)
    runner.measure(order[0], WARMUP_TOKENS, 0)  # one-off costs (allocator, kernel choice) stay out of the numbers
    measured: dict[str, list[PromptMeasure]] = {category: [] for category in prompts}
    for turn, prompt in enumerate(order * repeat):
        if turn % len(order) == 0:
            runner.forget()  # a pass never drafts from its own prompts' earlier outputs
        measured[prompt.category].append(runner.measure(prompt, max_new_tokens, turn))
        if on_step:
            on_step(prompt.category)
    return _result(measured, pipeline.generator.k, max_new_tokens, list(runner.generators))


def run_repeated(
    pipeline: Pipeline,
    prompts: dict[str, list[BenchPrompt]],
    max_new_tokens: int,
    on_step: Callable[[str], None] | None = None,
    drafters: Sequence[str] = (),
) -> dict[str, BenchResult]:
    """The repeated workload: PASSES over the prompt set through one pipeline, plain and SSp per prompt.

    first: history starts empty (it fills with this pass's earlier prompts); warm: the same prompts
    again, drafting from everything the first pass left; cold: history cleared, the same once more.
    """
    runner = _Runner(pipeline, None, drafters)
    order = _round_robin(prompts)
    runner.measure(order[0], WARMUP_TOKENS, 0)
    runner.forget()
    results: dict[str, BenchResult] = {}
    for name in PASSES:
        if name == "cold":
            runner.forget()
        measured: dict[str, list[PromptMeasure]] = {category: [] for category in prompts}
        for turn, prompt in enumerate(order):
            measured[prompt.category].append(runner.measure(prompt, max_new_tokens, turn))
            if on_step:
                on_step(f"{name} {prompt.category}")
        results[name] = _result(measured, pipeline.generator.k, max_new_tokens, list(runner.generators))
    return results


def _result(measured: dict[str, list[PromptMeasure]], k: int, max_new_tokens: int, drafters: list[str]) -> BenchResult:
    categories = [_category(name, runs, k) for name, runs in measured.items()]
    overall = _category(ALL, [m for runs in measured.values() for m in runs], k)
    return BenchResult(categories, overall, max_new_tokens, drafters)


def drafter_generators(pipeline: Pipeline, names: Sequence[str]) -> dict[str, tuple[Generator, Shared]]:
    """One generator per drafter name around the pipeline's target, with what its requests share (its
    drafter); the pipeline's own for its drafter."""
    config = pipeline.config
    generators: dict[str, tuple[Generator, Shared]] = {}
    for name in dict.fromkeys(names or [config.speculation.drafter]):
        if name == config.speculation.drafter:
            generators[name] = pipeline.generator, pipeline.shared
            continue
        if name == "model" and pipeline.draft is None:
            raise UsageError(
                Problem(
                    "--drafter",
                    name,
                    "the loaded config has no draft model",
                    "add a `draft:` section to the config, or compare ngram and suffix",
                )
            )
        data = config.model_dump()
        data["speculation"]["drafter"] = name
        other = config_from_dict(data)
        shared = share(other, pipeline.target, pipeline.draft, cost=pipeline.shared.cost)
        generators[name] = build_generator(other, pipeline.target, pipeline.draft, shared), shared
    return generators


def forget_history(shared: Shared) -> None:
    """Clear what a learning drafter remembers of earlier requests (nothing to do for the others)."""
    if isinstance(shared.drafter, SuffixDrafter):
        shared.drafter.history.clear()


class _Runner:
    def __init__(self, pipeline: Pipeline, hf_lookup_tokens: int | None, drafters: Sequence[str] = ()):
        self.pipeline = pipeline
        self.generators = drafter_generators(pipeline, drafters)
        self.hf = hf_model(pipeline.target) if hf_lookup_tokens else None
        self.assistant = hf_model(pipeline.draft) if pipeline.draft is not None else None
        self.hf_lookup_tokens = hf_lookup_tokens

    def forget(self) -> None:
        for _, shared in self.generators.values():
            forget_history(shared)

    def measure(self, prompt: BenchPrompt, max_new_tokens: int, turn: int) -> PromptMeasure:
        """Each method once on `prompt`, starting with method number `turn` (modulo their count)."""
        p = self.pipeline
        ids = p.encode(prompt.text)
        eos = p.eos_token_ids
        methods: dict[str, Callable[[], Any]] = {
            "plain": lambda: plain_generate(p.target, ids, max_new_tokens, p.config.sampling, eos)
        }
        for name, (generator, _) in self.generators.items():
            methods[f"ssp:{name}"] = lambda g=generator: g.generate(ids, max_new_tokens, eos)
        if self.hf is not None:
            hf = self.hf
            methods["hf_plain"] = lambda: hf_generate(hf, ids, max_new_tokens, eos)
            methods["hf_lookup"] = lambda: hf_generate(
                hf, ids, max_new_tokens, eos, prompt_lookup_tokens=self.hf_lookup_tokens
            )
            if self.assistant is not None:
                methods["hf_assisted"] = lambda: hf_generate(hf, ids, max_new_tokens, eos, assistant=self.assistant)
        names = list(methods)
        start = turn % len(names)
        runs = {name: methods[name]() for name in names[start:] + names[:start]}
        plain = runs.pop("plain")
        drafted = {}
        for name in self.generators:
            run = runs.pop(f"ssp:{name}")
            drafted[name] = DrafterRun(run.stats, run.tokens == plain.tokens)
        hf_plain = runs.get("hf_plain")
        first = next(iter(drafted))
        return PromptMeasure(
            prompt,
            plain.stats,
            drafted[first].stats,
            drafted[first].outputs_equal,
            **runs,
            hf_equal=None if hf_plain is None else hf_plain.tokens == plain.tokens,
            drafters=drafted,
        )


def _category(name: str, measures: list[PromptMeasure], k: int) -> CategoryResult:
    return CategoryResult(name, measures, k_row(k, [m.plain for m in measures], [m.ssp for m in measures], KSetup()))


def _round_robin(prompts: dict[str, list[BenchPrompt]]) -> list[BenchPrompt]:
    longest = max((len(group) for group in prompts.values()), default=0)
    return [group[i] for i in range(longest) for group in prompts.values() if i < len(group)]
