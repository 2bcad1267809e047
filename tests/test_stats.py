"""Stats definitions, each under its owner's name: Spec-Bench's τ and vLLM's mean acceptance length differ
(plain steps count in one, not in the other), so both are reported and neither may stand in for the other."""

from __future__ import annotations

import pytest

from neuron_ssp.speculation.stats import GenerationStats, merge_stats, throughput_ratio


def stats_of(calls: list[tuple[int, int, int]], k: int = 5) -> GenerationStats:
    stats = GenerationStats(k=k)
    for call in calls:
        stats.record_call(*call)
    return stats


def test_spec_bench_tau_counts_plain_steps_and_vllm_does_not():
    # two drafting calls (4 drafted: 4 and 1 kept), two plain steps (nothing drafted, one token each)
    stats = stats_of([(4, 4, 5), (0, 0, 1), (4, 1, 2), (0, 0, 1)])
    assert stats.mean_accepted_length == pytest.approx(9 / 4)  # Spec-Bench's τ: tokens / target calls
    assert stats.num_drafts == 2
    assert stats.vllm_mean_acceptance_length == pytest.approx(1 + 5 / 2)  # vLLM: 1 + accepted / num_drafts
    assert stats.acceptance_rate == pytest.approx(5 / 8)


def test_per_position_rates_conditional_and_vllm():
    # a short window (2 drafted) and a full one (4 drafted, 3 kept)
    stats = stats_of([(2, 2, 3), (4, 3, 4)])
    assert stats.per_position_acceptance == [1.0, 1.0, 1.0, 0.0]  # accepted at i / drafts reaching i
    assert stats.vllm_per_position_acceptance == [1.0, 1.0, 0.5, 0.0]  # accepted at i / num_drafts


def test_nothing_drafted_reads_like_vllm():
    stats = stats_of([(0, 0, 1)] * 3)
    assert stats.num_drafts == 0 and stats.vllm_mean_acceptance_length == 1.0
    assert stats.vllm_per_position_acceptance == [None] * 4


def test_a_block_cut_by_eos_counts_only_up_to_the_eos():
    # 4 drafted, the target agreed with all; EOS was the 2nd draft: 2 committed
    stats = stats_of([(4, 4, 2)])
    assert (stats.draft_tokens, stats.accepted_tokens, stats.loop_tokens) == (2, 2, 2)
    assert stats.per_position_acceptance == [1.0, 1.0, None, None]
    # the bonus token was the EOS: every draft counts
    stats = stats_of([(4, 4, 5)])
    assert (stats.draft_tokens, stats.accepted_tokens) == (4, 4)
    # a rejection at draft 2, the target's own token is EOS: the drafts were all judged
    stats = stats_of([(4, 1, 2)])
    assert (stats.draft_tokens, stats.accepted_tokens) == (4, 1)


def timed(stats: GenerationStats, draft_s: float, target_s: float, wall_s: float) -> GenerationStats:
    stats.time_draft_s, stats.time_target_s, stats.wall_s = draft_s, target_s, wall_s
    return stats


def test_json_holds_each_figure_under_its_definition():
    # one drafting call (4 drafted, 2 kept, 3 committed) and one plain step; 8 tokens in 2 s
    stats = timed(stats_of([(4, 2, 3), (0, 0, 1)]), draft_s=0.5, target_s=1.25, wall_s=2.0)
    stats.new_tokens = 8
    assert stats.to_dict() == {
        "k": 5,
        "new_tokens": 8,
        "acceptance_rate": 0.5,  # 2 kept of 4 drafted
        "mean_accepted_length": 2.0,  # τ: 4 committed / 2 calls
        "target_calls": 2,
        "num_drafts": 1,
        "vllm_mean_acceptance_length": 3.0,  # 1 + 2 kept / 1 drafting call
        "draft_tokens": 4,
        "accepted_tokens": 2,
        "per_position_acceptance": [1.0, 1.0, 0.0, 0.0],
        "vllm_per_position_acceptance": [1.0, 1.0, 0.0, 0.0],
        "tokens_per_s": 4.0,
        "ms_per_token": 250.0,
        "wall_s": 2.0,
        "time_draft_s": 0.5,
        "time_target_s": 1.25,
        "time_overhead_s": 0.25,
        "tokens_after_eos": 0,  # work an engine did past an EOS it could not stop at
    }


def test_merged_runs_are_ratios_of_sums():
    long = timed(stats_of([(4, 4, 5)] * 3), draft_s=1.0, target_s=2.0, wall_s=4.0)  # 15 tokens, all kept
    short = timed(stats_of([(4, 0, 1), (0, 0, 1)]), draft_s=0.5, target_s=0.5, wall_s=1.0)  # 2 tokens
    long.new_tokens, short.new_tokens = 15, 2
    total = merge_stats([long, short])
    assert (total.target_calls, total.num_drafts, total.new_tokens) == (5, 4, 17)
    assert total.acceptance_rate == pytest.approx(12 / 16)  # not the mean of 1.0 and 0.0
    assert total.mean_accepted_length == pytest.approx(17 / 5)
    assert total.vllm_mean_acceptance_length == pytest.approx(1 + 12 / 4)
    assert total.per_position_acceptance == pytest.approx([3 / 4] * 4)
    assert (total.time_draft_s, total.time_target_s, total.wall_s) == (1.5, 2.5, 5.0)
    assert total.tokens_per_s == pytest.approx(17 / 5)
    assert merge_stats([]).to_dict() == GenerationStats().to_dict()


def test_throughput_ratio_is_tokens_per_second_over_the_baselines():
    fast, slow = GenerationStats(new_tokens=30, wall_s=1.0), GenerationStats(new_tokens=20, wall_s=2.0)
    assert throughput_ratio(fast, slow) == pytest.approx(3.0)
    assert throughput_ratio(fast, GenerationStats()) == 0.0
