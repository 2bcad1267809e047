"""bench: prompt selection, per-prompt interleaving, per-category rows, and the HF comparison."""

from __future__ import annotations

import pytest
from conftest import TableBackend
from tools_support import PROMPT_ROWS, pipeline_on, tiny_config, tiny_pipeline, write_prompts

import neuron_ssp.tools.bench as bench
from neuron_ssp.errors import UsageError
from neuron_ssp.tools.bench import ALL, run_bench
from neuron_ssp.tools.prompt_set import BenchPrompt, balanced, by_category, load_prompts

SUMMARY_KEYS = {
    "prompts",
    "plain_tok_s",
    "ssp_tok_s",
    "speedup",
    "hf_plain_tok_s",
    "ssp_vs_hf_plain",
    "hf_prompt_lookup_speedup",
    "mean_accepted_length",
    "acceptance_rate",
    "outputs_equal",
}


def test_prompt_file_errors_name_the_line(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        load_prompts(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\nnot json\n')
    with pytest.raises(UsageError, match="line 2 is not JSON"):
        load_prompts(bad)
    bad.write_text('{"category": "qa"}\n')
    with pytest.raises(UsageError, match="'prompt'"):
        load_prompts(bad)


def test_selection_by_category_and_round_robin(tmp_path):
    prompts = load_prompts(write_prompts(tmp_path / "p.jsonl", PROMPT_ROWS + [("third", "z")]))
    assert [p.category for p in balanced(prompts, 4)] == ["copy", "open", "third", "copy"]
    assert {c: len(v) for c, v in by_category(prompts, ["open"], 1).items()} == {"open": 1}
    with pytest.raises(UsageError, match="copy, open, third"):
        by_category(prompts, ["nope"])
    with pytest.raises(UsageError, match="--nb-prompts"):
        balanced(prompts, 0)


def test_halves_take_alternate_positions_per_category_after_joining_files(tmp_path):
    first = load_prompts(write_prompts(tmp_path / "a.jsonl", [("qa", "q0"), ("qa", "q1"), ("rag", "r0")]))
    second = load_prompts(write_prompts(tmp_path / "b.jsonl", [("qa", "q2"), ("rag", "r1"), ("qa", "q3")]))
    choose = by_category(first + second, half="choose")
    report = by_category(first + second, half="report")
    assert {c: [p.text for p in g] for c, g in choose.items()} == {"qa": ["q0", "q2"], "rag": ["r0"]}
    assert {c: [p.text for p in g] for c, g in report.items()} == {"qa": ["q1", "q3"], "rag": ["r1"]}
    assert [p.text for p in by_category(first + second, ["qa"], 1, "report")["qa"]] == ["q1"]
    with pytest.raises(UsageError, match="--half"):
        by_category(first, half="other")


def test_default_prompt_set_has_the_six_spec_bench_categories():
    categories = by_category(load_prompts())
    assert set(categories) == {"mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag"}


def test_bench_rows_compare_with_hugging_face_on_the_same_model():
    pipeline = tiny_pipeline()
    prompts = {"copy": [BenchPrompt("copy", PROMPT_ROWS[0][1])], "open": [BenchPrompt("open", PROMPT_ROWS[2][1])]}
    steps = []
    result = run_bench(pipeline, prompts, 10, hf_lookup_tokens=4, on_step=steps.append)
    assert steps == ["copy", "open"]
    assert [c.category for c in result.categories] == ["copy", "open"] and result.overall.category == ALL
    for category in [*result.categories, result.overall]:
        summary = category.summary()
        assert set(summary) == SUMMARY_KEYS
        assert summary["outputs_equal"] is True  # greedy SSp == plain, token for token
        assert summary["plain_tok_s"] > 0 and summary["hf_plain_tok_s"] > 0
        assert summary["hf_prompt_lookup_speedup"] > 0
        assert category.plain_vs_hf_plain > 0
        assert summary["ssp_vs_hf_plain"] == pytest.approx(summary["ssp_tok_s"] / summary["hf_plain_tok_s"])
    assert all(m.hf_equal for m in result.overall.measures)  # HF greedy == our greedy on the same model
    assert result.overall.summary()["prompts"] == 2


def test_bench_without_a_hugging_face_model_leaves_its_columns_empty():
    pipeline = pipeline_on(TableBackend(97, seed=0), tiny_config())
    prompts = {"copy": [BenchPrompt("copy", PROMPT_ROWS[0][1])]}
    summary = run_bench(pipeline, prompts, 8, hf_lookup_tokens=10).categories[0].summary()
    assert summary["hf_plain_tok_s"] is None and summary["hf_prompt_lookup_speedup"] is None
    assert summary["ssp_vs_hf_plain"] is None
    assert summary["outputs_equal"] is True


def test_repeat_measures_each_prompt_again_and_rotates_the_order(monkeypatch):
    calls: list[str] = []
    real_plain, real_hf = bench.plain_generate, bench.hf_generate
    monkeypatch.setattr(bench, "plain_generate", lambda *a, **kw: calls.append("plain") or real_plain(*a, **kw))
    monkeypatch.setattr(
        bench, "hf_generate", lambda *a, **kw: calls.append("hf_lookup" if kw else "hf_plain") or real_hf(*a, **kw)
    )
    prompts = {"copy": [BenchPrompt("copy", PROMPT_ROWS[0][1])]}
    result = run_bench(tiny_pipeline(), prompts, 6, hf_lookup_tokens=3, repeat=2)
    category = result.categories[0]
    assert len(category.measures) == 2 and category.summary()["prompts"] == 1
    # warm-up and turn 0 start with our plain run; turn 1 starts with SSp (not recorded here), then HF plain
    assert calls[:3] == ["plain", "hf_plain", "hf_lookup"] and calls[6:9] == ["hf_plain", "hf_lookup", "plain"]


def test_drafters_compared_in_one_run_each_equal_plain():
    pipeline = tiny_pipeline()
    prompts = {"copy": [BenchPrompt("copy", PROMPT_ROWS[0][1])], "open": [BenchPrompt("open", PROMPT_ROWS[2][1])]}
    result = run_bench(pipeline, prompts, 10, hf_lookup_tokens=None, drafters=["ngram", "suffix"])
    assert result.drafters == ["ngram", "suffix"]
    for category in [*result.categories, result.overall]:
        for name in result.drafters:
            assert category.drafter_equal(name) == len(category.measures)
            assert category.drafter_fit(name).speedup_measured > 0
    measure = result.overall.measures[0]
    assert measure.ssp is measure.drafters["ngram"].stats  # the first drafter is the headline SSp column


def test_repeated_workload_warms_the_history_then_clears_it(monkeypatch):
    pipeline = tiny_pipeline()
    prompts = {"copy": [BenchPrompt("copy", PROMPT_ROWS[0][1])], "open": [BenchPrompt("open", PROMPT_ROWS[2][1])]}
    sizes: list[int] = []
    real = bench.forget_history

    def forget(shared):
        real(shared)
        sizes.append(shared.drafter.history.stored_tokens)

    monkeypatch.setattr(bench, "forget_history", forget)
    passes = bench.run_repeated(pipeline, prompts, 10, drafters=["suffix"])
    assert list(passes) == ["first", "warm", "cold"] and sizes == [0, 0]  # after the warm-up, before cold
    generator = bench.drafter_generators(pipeline, ["suffix"])  # a new one: fresh history
    assert generator["suffix"][1].drafter.history.stored_tokens == 0
    for result in passes.values():
        assert result.overall.drafter_equal("suffix") == 2
    warm, first = passes["warm"].overall.drafter_fit("suffix"), passes["first"].overall.drafter_fit("suffix")
    assert warm.mean_accepted_length > first.mean_accepted_length  # the second pass drafts from the first's outputs


def test_unknown_drafter_name_is_a_config_error():
    with pytest.raises(UsageError, match="speculation.drafter"):
        bench.drafter_generators(tiny_pipeline(), ["ngram", "suffx"])
