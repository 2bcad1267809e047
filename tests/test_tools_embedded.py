"""tune-k, eval and bench on the embedded SmolLM2 with tiny settings (one model load for the module)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from tools_support import pipeline_on

from neuron_ssp.cli import main
from neuron_ssp.config import load_config
from neuron_ssp.pipeline.load import load_pipeline
from neuron_ssp.pipeline.pipeline import Pipeline

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def loaded(embedded_cache: str) -> Pipeline:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("NEURON_SSP_CACHE", embedded_cache)
        return load_pipeline(load_config())


@pytest.fixture
def embedded(loaded: Pipeline, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each command gets a pipeline for its own config around the one loaded model."""
    monkeypatch.setattr(
        "neuron_ssp.cli.tools.load_with_status",
        lambda config: pipeline_on(loaded.target, config, loaded.tokenizer, loaded.eos_token_ids),
    )


def invoke(*args: str) -> dict:
    result = CliRunner().invoke(main, [*args, "--threads", "1", "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_bench_one_category(embedded):
    data = invoke("bench", "--categories", "summarization", "--nb-prompts", "1", "--max-new-tokens", "16")
    row = data["categories"]["summarization"]
    assert row["outputs_equal"] is True and row["prompts"] == 1
    assert row["plain_tok_s"] > 0 and row["hf_plain_tok_s"] > 0 and row["hf_prompt_lookup_speedup"] > 0
    assert row["acceptance_rate"] > 0  # a summary copies from its article: the drafter proposes


def test_tune_k_two_windows(embedded):
    data = invoke("tune-k", "--k", "2,4", "--nb-prompts", "1", "--max-new-tokens", "16")
    assert [row["k"] for row in data["rows"]] == [2, 4] and data["recommended_k"] in (2, 4)


def test_eval_greedy_plain_and_ssp_score_the_same(embedded):
    data = invoke("eval", "--nb-prompts", "3", "--answer-tokens", "8")
    assert data["plain"]["correct"] == data["ssp"]["correct"] and data["z_test"]["differ"] is False


def test_lossless_on_the_real_model(embedded):
    # policy fixed: the default cost policy keeps no draft on this prompt at temperature 1 (the target
    # hesitates), which would leave the acceptor unexercised; drafted_share counts only checked drafts
    data = invoke("eval", "--lossless", "--samples", "150", "--policy", "fixed")
    assert data["drafted_share"] > 0.5 and data["acceptance_rate"] > 0
    assert data["permutation_p_value"] > 0.001
