"""Measure α, c and the speedup for each window k, next to what the width-cost and Leviathan models predict.

Per prompt, plain decoding runs once and speculative sampling once per k, back to back and in an order
that rotates from prompt to prompt, so machine noise hits plain and speculative runs alike (on Neuron
one loaded target holds every compiled k). Each row aggregates all prompts (ratios of sums). Before
the runs of each prompt, the target's call cost per window width is timed (a few calls per width,
width_cost.py); with the measured acceptance it predicts each k's speedup, which the Leviathan model
with c ≈ 0 does not on a CPU.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from neuron_ssp.engines.native import plain_generate
from neuron_ssp.speculation.call_cost import WidthCost, WidthTimer
from neuron_ssp.speculation.stats import GenerationStats, merge_stats, throughput_ratio
from neuron_ssp.tools.leviathan import (
    draft_length_counts,
    full_draft_fraction,
    predicted_speedup,
    predicted_speedup_for_drafts,
)
from neuron_ssp.tools.per_k import KGroup, KSetup
from neuron_ssp.tools.prompt_set import BenchPrompt
from neuron_ssp.tools.width_cost import predicted_speedup_for_widths

# Measured speedups closer than this to the best one are within noise on a shared machine: the smaller
# window wins (less draft work wasted, and on Neuron a smaller compiled target).
RECOMMEND_TOLERANCE = 0.02
WARMUP_TOKENS = 8
PLAIN = 0  # the key of plain decoding among the windows (a window is >= 2)
WIDTH_ROUNDS_PER_PROMPT = 3  # timed target calls per width after each prompt's runs (width_cost.py)

StepCallback = Callable[[str], None]


@dataclass
class KRow:
    k: int
    alpha: float  # accepted / proposed draft tokens
    c: float  # draft time per drafted token / plain decoding time per token
    mean_accepted_length: float
    per_position_acceptance: list[float | None]
    full_draft_fraction: float  # target calls that checked k-1 drafted tokens
    ms_per_token: float
    plain_ms_per_token: float
    # mean target call (the prompt's prefill counted as one call): a k-wide call costs more than a 1-wide
    # one where the hardware is not idle at width 1 (CPUs); the Leviathan model assumes equal cost
    plain_call_ms: float
    ssp_call_ms: float
    speedup_measured: float
    speedup_predicted: float  # Leviathan model over the measured draft lengths (what we compare)
    speedup_leviathan: float  # the paper's formula, as if every call drafted k-1 tokens
    speedup_width_model: float = 0.0  # τ, host time per call, prefill and call cost per width (width_cost.py)
    setup: KSetup = field(default_factory=KSetup)

    @property
    def width_model_gap(self) -> float:
        """measured / width-model prediction - 1."""
        return self.speedup_measured / self.speedup_width_model - 1.0 if self.speedup_width_model else 0.0

    @property
    def prediction_gap(self) -> float:
        """measured / predicted - 1: negative when the loop loses time the model does not count."""
        return self.speedup_measured / self.speedup_predicted - 1.0 if self.speedup_predicted else 0.0


@dataclass
class TuneKResult:
    rows: list[KRow]
    prompts: int
    max_new_tokens: int
    width_cost: WidthCost | None = None

    @property
    def recommended_k(self) -> int:
        best = max(row.speedup_measured for row in self.rows)
        return min(row.k for row in self.rows if row.speedup_measured >= best * (1.0 - RECOMMEND_TOLERANCE))


def tune_k(
    groups: Iterable[KGroup], prompts: list[BenchPrompt], max_new_tokens: int, on_step: StepCallback | None = None
) -> TuneKResult:
    """Run every prompt plainly and with each k of each group; one row per k."""
    plain_runs: dict[int, list[GenerationStats]] = {}
    ssp_runs: dict[int, list[GenerationStats]] = {}
    setups: dict[int, KSetup] = {}
    costs: dict[int, WidthCost] = {}  # k -> the call costs timed on the target that ran k
    padded = False  # Neuron: every call scores the compiled k, however few tokens were drafted
    for group in groups:
        setups.update(group.setups)
        _warm_up(group, prompts[0])
        padded = group.pipeline.target.max_score_width is not None
        # one timer per loaded target: NxD Inference loads one target per k, whose every call (plain decoding
        # included) is that k wide; elsewhere one group holds every k and this runs once
        timer = WidthTimer(group.pipeline.target, sorted(group.generators))
        timer.round(group.pipeline.encode(prompts[0].text))  # warm-up round, not counted
        timer = WidthTimer(group.pipeline.target, sorted(group.generators))
        for turn, prompt in enumerate(prompts):
            runs = _measure(group, prompt, max_new_tokens, turn)
            timer.round(group.pipeline.encode(prompt.text), WIDTH_ROUNDS_PER_PROMPT)
            for k in group.generators:
                plain_runs.setdefault(k, []).append(runs[PLAIN])
                ssp_runs.setdefault(k, []).append(runs[k])
                if on_step:
                    on_step(f"k={k} · {prompt.category}")
        costs.update(dict.fromkeys(group.generators, timer.cost()))
        del group  # on Neuron: release this k's compiled target before the next one loads
    rows = [k_row(k, plain_runs[k], ssp_runs[k], setups[k], costs.get(k), padded) for k in sorted(ssp_runs)]
    return TuneKResult(rows, len(prompts), max_new_tokens, merged_cost(list(costs.values())))


def merged_cost(costs: list[WidthCost]) -> WidthCost | None:
    """One curve for the report: each width from the first target that timed it (one target: its own)."""
    if not costs:
        return None
    ms: dict[int, float] = {}
    for cost in costs:
        ms.update({w: t for w, t in cost.ms.items() if w not in ms})
    return WidthCost(ms, costs[0].prefill_ms)


def _measure(group: KGroup, prompt: BenchPrompt, max_new_tokens: int, turn: int) -> dict[int, GenerationStats]:
    """Plain decoding (key PLAIN) and each k once; the order rotates with `turn` so none always runs first."""
    pipeline = group.pipeline
    ids, eos = pipeline.encode(prompt.text), pipeline.eos_token_ids
    keys = [PLAIN, *group.generators]
    keys = keys[turn % len(keys) :] + keys[: turn % len(keys)]
    runs = {}
    for key in keys:
        if key == PLAIN:
            runs[key] = plain_generate(pipeline.target, ids, max_new_tokens, pipeline.config.sampling, eos).stats
        else:
            runs[key] = group.generators[key].generate(ids, max_new_tokens, eos).stats
    return runs


def k_row(
    k: int,
    plain_runs: list[GenerationStats],
    ssp_runs: list[GenerationStats],
    setup: KSetup,
    cost: WidthCost | None = None,
    padded: bool = False,
) -> KRow:
    """One row from the runs of the same prompts, plain and with window k."""
    plain, ssp = merge_stats(plain_runs), merge_stats(ssp_runs)
    lengths: Counter[int] = sum((draft_length_counts(run) for run in ssp_runs), Counter())
    alpha = ssp.acceptance_rate
    plain_s_per_token = plain.wall_s / plain.new_tokens if plain.new_tokens else 0.0
    draft_s_per_token = ssp.time_draft_s / ssp.draft_tokens if ssp.draft_tokens else 0.0
    c = draft_s_per_token / plain_s_per_token if plain_s_per_token else 0.0
    return KRow(
        k=k,
        alpha=alpha,
        c=c,
        mean_accepted_length=ssp.mean_accepted_length,
        per_position_acceptance=ssp.per_position_acceptance,
        full_draft_fraction=full_draft_fraction(lengths, k),
        ms_per_token=ssp.ms_per_token,
        plain_ms_per_token=plain.ms_per_token,
        plain_call_ms=_call_ms(plain_runs),
        ssp_call_ms=_call_ms(ssp_runs),
        speedup_measured=throughput_ratio(ssp, plain),
        speedup_predicted=predicted_speedup_for_drafts(alpha, c, lengths),
        speedup_leviathan=predicted_speedup(alpha, k, c),
        setup=setup,
        speedup_width_model=(
            predicted_speedup_for_widths(plain, ssp, len(ssp_runs), lengths, cost, k if padded else None)
            if cost
            else 0.0
        ),
    )


def _call_ms(runs: list[GenerationStats]) -> float:
    calls = sum(run.target_calls + 1 for run in runs)  # + 1: each run's prefill
    return 1000.0 * sum(run.time_target_s for run in runs) / calls if calls else 0.0


def _warm_up(group: KGroup, prompt: BenchPrompt) -> None:
    """First calls pay one-off costs (allocator, kernel selection): keep them out of every k's numbers."""
    pipeline = group.pipeline
    ids = pipeline.encode(prompt.text)
    plain_generate(pipeline.target, ids, WARMUP_TOKENS, pipeline.config.sampling, pipeline.eos_token_ids)
    for generator in group.generators.values():
        generator.generate(ids, WARMUP_TOKENS, pipeline.eos_token_ids)
