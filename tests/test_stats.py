"""Stats definitions, each under its owner's name (issue 14 item 7)."""

from __future__ import annotations

import pytest

from neuron_ssp.speculation.stats import GenerationStats


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


def test_json_names_both_definitions():
    data = stats_of([(4, 2, 3)]).to_dict()
    assert {"mean_accepted_length", "vllm_mean_acceptance_length", "num_drafts",
            "per_position_acceptance", "vllm_per_position_acceptance"} <= set(data)
