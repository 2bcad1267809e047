"""tune-k: rows from measured runs, the width and Leviathan predictions, the recommendation."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from tools_support import PROMPT_ROWS, tiny_config, tiny_pipeline

import neuron_ssp.tools.tune_k as tune_k_module
from neuron_ssp.engines.base import GenerationResult
from neuron_ssp.speculation.stats import GenerationStats
from neuron_ssp.tools.per_k import KGroup, KSetup, shared_target_groups, with_k
from neuron_ssp.tools.prompt_set import BenchPrompt
from neuron_ssp.tools.tune_k import KRow, TuneKResult, k_row, tune_k

PROMPTS = [BenchPrompt(c, p) for c, p in PROMPT_ROWS]


MEASURED_TOKENS = 12  # the warm-up runs generate WARMUP_TOKENS (8): told apart by their length


def record_measured_runs(monkeypatch: pytest.MonkeyPatch, group: KGroup) -> list[tuple[int, GenerationStats]]:
    """(window, stats) of every measured run in call order, window 0 for plain decoding."""
    runs: list[tuple[int, GenerationStats]] = []

    def recording(
        key: int, generate: Callable[..., GenerationResult], budget_at: int
    ) -> Callable[..., GenerationResult]:
        def run(*args: Any) -> GenerationResult:
            result = generate(*args)
            if args[budget_at] == MEASURED_TOKENS:
                runs.append((key, result.stats))
            return result

        return run

    # plain_generate(target, ids, max_new_tokens, ...); generator.generate(ids, max_new_tokens, eos)
    monkeypatch.setattr(tune_k_module, "plain_generate", recording(0, tune_k_module.plain_generate, 2))
    for k, generator in group.generators.items():
        monkeypatch.setattr(generator, "generate", recording(k, generator.generate, 1))
    return runs


def test_each_row_is_the_ratio_of_sums_over_that_windows_measured_runs(monkeypatch):
    group = next(shared_target_groups(tiny_pipeline(), [2, 3, 5]))
    runs = record_measured_runs(monkeypatch, group)
    steps = []
    result = tune_k([group], PROMPTS, MEASURED_TOKENS, steps.append)
    assert [row.k for row in result.rows] == [2, 3, 5] and len(steps) == 3 * len(PROMPTS)
    # plain once and each k once per prompt, the first run rotating so no window always runs first
    assert [key for key, _ in runs] == [0, 2, 3, 5, 2, 3, 5, 0, 3, 5, 0, 2, 5, 0, 2, 3]
    plain = [stats for key, stats in runs if key == 0]
    plain_tok_s = sum(s.new_tokens for s in plain) / sum(s.wall_s for s in plain)
    for row in result.rows:
        ssp = [stats for key, stats in runs if key == row.k]
        drafted, accepted = sum(s.draft_tokens for s in ssp), sum(s.accepted_tokens for s in ssp)
        assert drafted > 0  # the repetitive prompts draft: otherwise the figures below would prove little
        assert row.alpha == pytest.approx(accepted / drafted)
        assert row.mean_accepted_length == pytest.approx(
            sum(s.loop_tokens for s in ssp) / sum(s.target_calls for s in ssp)
        )
        assert row.per_position_acceptance == pytest.approx(
            [
                sum(s.accepted_at[i] for s in ssp) / sum(s.proposed_at[i] for s in ssp)
                if sum(s.proposed_at[i] for s in ssp)
                else None
                for i in range(row.k - 1)
            ]
        )
        ssp_tok_s = sum(s.new_tokens for s in ssp) / sum(s.wall_s for s in ssp)
        assert row.speedup_measured == pytest.approx(ssp_tok_s / plain_tok_s)
        assert row.ms_per_token == pytest.approx(1000.0 / ssp_tok_s)
        assert row.c == pytest.approx(sum(s.time_draft_s for s in ssp) / drafted * plain_tok_s)


def test_row_assembly_from_known_stats():
    plain = GenerationStats(k=1, new_tokens=100, wall_s=10.0, target_calls=99, loop_tokens=99)
    ssp = GenerationStats(k=3, new_tokens=100, wall_s=5.0, time_draft_s=0.04)
    for _ in range(20):
        ssp.record_call(2, 2, 3)  # full drafts, all accepted
    for _ in range(20):
        ssp.record_call(2, 0, 1)  # full drafts, first rejected
    row = k_row(3, [plain], [ssp], KSetup())
    assert row.alpha == pytest.approx(0.5)
    assert row.c == pytest.approx((0.04 / 80) / 0.1)  # draft s per drafted token / plain s per token
    assert row.mean_accepted_length == pytest.approx(2.0)
    assert row.full_draft_fraction == 1.0
    assert row.speedup_measured == pytest.approx(2.0)
    assert row.speedup_predicted == pytest.approx(1.75 / (1 + 2 * row.c))
    assert row.speedup_predicted == pytest.approx(row.speedup_leviathan)
    assert row.prediction_gap == pytest.approx(2.0 / row.speedup_predicted - 1)


def _row(k: int, measured: float) -> KRow:
    return KRow(k, 0.5, 0.0, 1.5, [], 1.0, 10.0, 12.0, 50.0, 60.0, measured, measured, measured)


def test_recommendation_prefers_the_smaller_k_within_noise():
    assert TuneKResult([_row(2, 1.0), _row(3, 1.5), _row(4, 1.51)], 1, 8).recommended_k == 3
    assert TuneKResult([_row(2, 1.0), _row(3, 1.2), _row(4, 1.5)], 1, 8).recommended_k == 4


def test_with_k_keeps_k_min_valid():
    config = tiny_config(speculation={"policy": "adaptive", "k": 6, "k_min": 4})
    assert with_k(config, 3).speculation.k == 3 and with_k(config, 3).speculation.k_min == 3


def _stats(tokens: int, calls: int, wall_ms: float, target_ms: float) -> GenerationStats:
    stats = GenerationStats(k=3, new_tokens=tokens, target_calls=calls)
    stats.wall_s, stats.time_target_s = wall_ms / 1000.0, target_ms / 1000.0
    return stats


def test_width_model_prices_each_call_by_the_width_it_scored():
    from neuron_ssp.speculation.call_cost import WidthCost
    from neuron_ssp.tools.width_cost import predicted_speedup_for_widths

    cost = WidthCost({1: 10.0, 2: 12.0, 3: 15.0})  # no prefill timed, no host time: calls only
    plain = _stats(21, 20, 200.0, 200.0)
    ssp = _stats(21, 10, 999.0, 999.0)  # the runs' own times are never read, only the host time outside
    # half the calls drafted 2 (width 3), half drafted 0 (width 1): τ = 2
    torch_like = predicted_speedup_for_widths(plain, ssp, 1, {2: 5, 0: 5}, cost, padded_width=None)
    assert torch_like == pytest.approx(20 * 10.0 / (10 * (15.0 + 10.0) / 2))
    neuron_like = predicted_speedup_for_widths(plain, ssp, 1, {2: 5, 0: 5}, cost, padded_width=3)  # k wide
    assert neuron_like == pytest.approx(20 * 10.0 / (10 * 15.0))


def test_width_model_counts_prefill_and_host_time_which_dilute_the_speedup():
    from neuron_ssp.speculation.call_cost import WidthCost
    from neuron_ssp.tools.width_cost import predicted_speedup_for_widths

    cost = WidthCost({1: 10.0, 3: 15.0}, prefill_ms=[40.0, 60.0])  # mean prefill 50 ms per run
    plain = _stats(42, 40, 2 * 50.0 + 40 * 10.0 + 40 * 1.0, 2 * 50.0 + 40 * 10.0)  # host 1 ms per call
    ssp = _stats(42, 20, 2 * 50.0 + 20 * 15.0 + 20 * 3.0, 2 * 50.0 + 20 * 15.0)  # host 3 ms per call
    predicted = predicted_speedup_for_widths(plain, ssp, 2, {2: 20}, cost, padded_width=None)
    assert predicted == pytest.approx((100.0 + 40 * 11.0) / (100.0 + 20 * 18.0))
    bare = predicted_speedup_for_widths(plain, ssp, 2, {2: 20}, WidthCost({1: 10.0, 3: 15.0}), None)
    assert predicted < bare  # shared prefill and loop time shrink what the wider calls buy


def test_tune_k_measures_the_call_cost_per_width_once():
    result = tune_k(shared_target_groups(tiny_pipeline(), [2, 4]), PROMPTS[:1], 8)
    assert result.width_cost is not None and sorted(result.width_cost.ms) == [1, 2, 4]
    assert len(result.width_cost.prefill_ms) == 1  # one prefill timed per prompt
    assert all(row.speedup_width_model > 0 for row in result.rows)


def test_the_default_table_fits_80_columns():
    from rich.console import Console

    from neuron_ssp.cli.tools_report import tune_k_table
    from neuron_ssp.speculation.call_cost import WidthCost

    result = TuneKResult(
        [_row(k, 1.0 + k / 10) for k in range(2, 11)], 4, 128, WidthCost({w: 30.0 + w for w in range(1, 11)})
    )
    console = Console(width=80, record=True)
    console.print(tune_k_table(result, "tune-k over 4 prompts", show_setup=False))
    lines = console.export_text().splitlines()
    assert max(len(line) for line in lines) <= 80
    assert all("…" not in line for line in lines)  # nothing cut
    wide = Console(width=250, record=True)
    wide.print(tune_k_table(result, "t", show_setup=True, wide=True))
    assert "Leviathan" in wide.export_text()
