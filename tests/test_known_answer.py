"""Known-answer checks on tiny models: they pass a working model and stop a random head, with a clear error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
from click.testing import CliRunner
from conftest import tiny_llama
from known_answer_support import char_tokenizer, greedy_ids, trained_tiny_llama

from neuron_ssp.cli import main
from neuron_ssp.embedded import models as embedded
from neuron_ssp.embedded.gguf_convert import _tied_plain_copy
from neuron_ssp.embedded.known_answer import KnownAnswer, greedy_answer, sentence_loss
from neuron_ssp.embedded.models import EmbeddedModel, check_embedded_answer
from neuron_ssp.errors import RuntimeProblem

PROMPT = "The Eiffel Tower is in"


@pytest.fixture(scope="module")
def tokenizer():
    return char_tokenizer()


@pytest.fixture(scope="module")
def trained(tokenizer):
    return trained_tiny_llama(tokenizer)


def randomise_head(model) -> None:
    torch.manual_seed(123)
    torch.nn.init.normal_(model.get_output_embeddings().weight, std=1.0)


def test_greedy_answer_passes_the_stored_continuation_and_stops_a_random_head(tokenizer):
    model = tiny_llama(0)
    answer = KnownAnswer(PROMPT, greedy_ids(model, tokenizer, PROMPT, 4))
    assert greedy_answer(model, tokenizer, answer).passed
    randomise_head(model)
    check = greedy_answer(model, tokenizer, answer)
    assert not check.passed and repr(tokenizer.decode(list(answer.expected_ids))) in check.detail


def test_sentence_loss_tells_a_trained_model_from_a_random_one(tokenizer, trained):
    assert sentence_loss(trained, tokenizer).passed
    random = sentence_loss(tiny_llama(0), tokenizer)
    assert not random.passed and "bound 2.29" in random.detail  # half of ln 97


def test_embedded_answer_failure_names_the_transformers_version_and_the_fix(tokenizer, monkeypatch, tmp_path):
    monkeypatch.setenv("NEURON_SSP_CACHE", str(tmp_path))
    model = tiny_llama(0)
    monkeypatch.setitem(
        embedded.EMBEDDED_MODELS,
        "tiny",
        EmbeddedModel("unused", "unused.gguf", KnownAnswer(PROMPT, greedy_ids(model, tokenizer, PROMPT, 4))),
    )
    check_embedded_answer(model, tokenizer, "embedded:tiny", "target.path")  # passes: no exception
    randomise_head(model)
    with pytest.raises(RuntimeProblem) as caught:
        check_embedded_answer(model, tokenizer, "embedded:tiny", "target.path")
    problem = caught.value.problems[0]
    assert problem.field == "target.path" and problem.value == "embedded:tiny"
    assert f"transformers {transformers.__version__}" in problem.rule and "known-answer" in problem.rule
    major = transformers.__version__.split(".")[0]
    assert f"delete {tmp_path / f'tiny-transformers{major}'}" in problem.fix


@pytest.mark.parametrize(
    ("config_ties", "head_missing", "tied"),
    [
        (False, True, True),  # transformers 4.46 on a GGUF without output.weight: head reported missing
        (True, False, True),  # transformers 5.x: the GGUF config already says tied
        (False, False, False),  # a GGUF with its own output.weight: keep it
    ],
)
def test_conversion_ties_the_head_when_the_config_or_the_loader_says_so(config_ties, head_missing, tied):
    source = tiny_llama(0)
    source.config.tie_word_embeddings = config_ties
    own_head = source.lm_head.weight.detach().clone()
    plain = _tied_plain_copy(source, {"lm_head.weight"} if head_missing else set())
    assert plain.config.tie_word_embeddings is tied
    expected_head = source.model.embed_tokens.weight if tied else own_head
    assert torch.equal(plain.lm_head.weight, expected_head)
    assert torch.equal(plain.model.embed_tokens.weight, source.model.embed_tokens.weight)


def save(model, tokenizer, directory: Path) -> Path:
    model.save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))
    return directory


def test_doctor_check_model_passes_a_working_model_and_fails_a_random_one(tokenizer, trained, tmp_path):
    good = save(trained, tokenizer, tmp_path / "good")
    bad = save(tiny_llama(0), tokenizer, tmp_path / "random")
    result = CliRunner().invoke(main, ["doctor", "--configs", str(tmp_path), "--check-model", str(good)])
    assert result.exit_code == 0, result.output
    assert "passed" in result.output and "reference English sentence" in result.output
    result = CliRunner().invoke(
        main,
        [
            "doctor",
            "--configs",
            str(tmp_path),
            "--json",
            "--check-model",
            str(good),
            "--check-model",
            str(bad),
            "--check-model",
            str(tmp_path / "missing"),
        ],
    )
    assert result.exit_code == 1
    checks = {Path(c["path"]).name: c for c in json.loads(result.stdout)["model_checks"]}
    assert checks["good"]["passed"] and not checks["random"]["passed"] and not checks["missing"]["passed"]
    assert "does not exist" in checks["missing"]["details"][0]
    assert checks["random"]["transformers"] == transformers.__version__
