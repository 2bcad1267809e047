"""tune-k: rows from measured runs, the recommendation, and writing k back into a config."""

from __future__ import annotations

import pytest
import yaml
from tools_support import PROMPT_ROWS, tiny_config, tiny_pipeline

from neuron_ssp.config import load_config
from neuron_ssp.speculation.stats import GenerationStats
from neuron_ssp.tools.config_edit import edit_k_text, write_k
from neuron_ssp.tools.per_k import KSetup, shared_target_groups, with_k
from neuron_ssp.tools.prompt_set import BenchPrompt
from neuron_ssp.tools.tune_k import KRow, TuneKResult, k_row, tune_k

PROMPTS = [BenchPrompt(c, p) for c, p in PROMPT_ROWS]


def test_one_row_per_k_with_consistent_numbers():
    steps = []
    result = tune_k(shared_target_groups(tiny_pipeline(), [2, 3, 5]), PROMPTS, 12, steps.append)
    assert [row.k for row in result.rows] == [2, 3, 5] and len(steps) == 3 * len(PROMPTS)
    for row in result.rows:
        assert 0.0 <= row.alpha <= 1.0 and row.c >= 0.0
        assert 1.0 <= row.mean_accepted_length <= row.k
        assert len(row.per_position_acceptance) == row.k - 1
        assert row.speedup_measured > 0 and row.speedup_predicted >= 1.0
    assert result.recommended_k in (2, 3, 5)


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


CONFIG_TEXT = """# my tuned config
target:
  path: embedded:smollm2-135m-instruct
speculation:
  drafter: ngram   # prompt lookup
  k: 4             # the window
  policy: fixed
sampling:
  temperature: 0.0
"""


def test_k_is_edited_in_place_and_comments_stay(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(CONFIG_TEXT)
    assert write_k(path, 7, tiny_config()) == "edited in place (comments kept)"
    text = path.read_text()
    assert "  k: 7             # the window\n" in text and "# my tuned config" in text
    assert text.replace("k: 7", "k: 4") == CONFIG_TEXT
    assert load_config(path).speculation.k == 7


def test_missing_k_line_or_section_is_added():
    without_k = CONFIG_TEXT.replace("  k: 4             # the window\n", "")
    assert yaml.safe_load(edit_k_text(without_k, 5))["speculation"]["k"] == 5
    no_section = "target:\n  path: x\n"
    assert yaml.safe_load(edit_k_text(no_section, 5)) == {"target": {"path": "x"}, "speculation": {"k": 5}}
    assert edit_k_text("speculation: {k: 4}\n", 5) is None


def test_flow_style_is_rewritten_and_a_missing_file_created(tmp_path):
    flow = tmp_path / "flow.yaml"
    flow.write_text("speculation: {k: 4, drafter: ngram}\n")
    assert write_k(flow, 6, tiny_config()) == "rewritten (comments could not be kept)"
    assert load_config(flow).speculation.k == 6
    new = tmp_path / "new.yaml"
    assert write_k(new, 3, tiny_config()) == "created"
    assert load_config(new).speculation.k == 3


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

    result = TuneKResult([_row(k, 1.0 + k / 10) for k in range(2, 11)], 4, 128,
                         WidthCost({w: 30.0 + w for w in range(1, 11)}))
    console = Console(width=80, record=True)
    console.print(tune_k_table(result, "tune-k over 4 prompts", show_setup=False))
    lines = console.export_text().splitlines()
    assert max(len(line) for line in lines) <= 80
    assert all("…" not in line for line in lines)  # nothing cut
    wide = Console(width=250, record=True)
    wide.print(tune_k_table(result, "t", show_setup=True, wide=True))
    assert "Leviathan" in wide.export_text()
