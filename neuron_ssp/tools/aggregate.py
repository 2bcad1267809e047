"""Totals over many generations: every rate is a ratio of sums (as Spec-Bench and vLLM report them),
never a mean of per-prompt ratios, so a 10-token answer weighs less than a 128-token one."""

from __future__ import annotations

from collections.abc import Sequence

from neuron_ssp.speculation.stats import GenerationStats


def merge_stats(runs: Sequence[GenerationStats]) -> GenerationStats:
    """One GenerationStats holding the sums of `runs` (all of the same window k)."""
    k = max((r.k for r in runs), default=1)
    total = GenerationStats(k=k)
    for run in runs:
        total.new_tokens += run.new_tokens
        total.target_calls += run.target_calls
        total.loop_tokens += run.loop_tokens
        total.draft_tokens += run.draft_tokens
        total.accepted_tokens += run.accepted_tokens
        total.time_draft_s += run.time_draft_s
        total.time_target_s += run.time_target_s
        total.wall_s += run.wall_s
        total.tokens_after_eos += run.tokens_after_eos
        for i, (proposed, accepted) in enumerate(zip(run.proposed_at, run.accepted_at, strict=True)):
            total.proposed_at[i] += proposed
            total.accepted_at[i] += accepted
    return total


def throughput_ratio(faster: GenerationStats, baseline: GenerationStats) -> float:
    """tokens/s of `faster` over tokens/s of `baseline` (0 when the baseline made nothing)."""
    return faster.tokens_per_s / baseline.tokens_per_s if baseline.tokens_per_s else 0.0
