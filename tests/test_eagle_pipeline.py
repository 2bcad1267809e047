"""The EAGLE drafters from a config (issue 42 item 4, runtime): `drafter: eagle3` and `ngram+eagle3` load a head
directory named by `draft.path`, every request drafts in its own slot of it, and the embedded head resolves to the
package's, checked by its known answer (a clear error while none ships)."""

from __future__ import annotations

import json

import pytest
import torch
from eagle_support import tiny_head
from neuron_support import VOCAB, save_tiny_llama, with_tokenizer
from transformers import AutoTokenizer

from neuron_ssp.config import EMBEDDED_DEFAULT, EMBEDDED_EAGLE3, SamplingConfig, load_config
from neuron_ssp.drafters import head_answer
from neuron_ssp.drafters.base import Draft
from neuron_ssp.drafters.combined import DraftChoice, LookupOrHead, best_rate
from neuron_ssp.drafters.eagle import EagleDrafter
from neuron_ssp.drafters.eagle_checkpoint import head_config_for, vocab_maps, write_checkpoint
from neuron_ssp.drafters.eagle_head import EagleHead
from neuron_ssp.embedded import heads
from neuron_ssp.embedded.models import resolve_model_path
from neuron_ssp.engines.native import plain_generate
from neuron_ssp.errors import RuntimeProblem
from neuron_ssp.pipeline.load import load_pipeline
from neuron_ssp.speculation.call_cost import WidthCost

PROMPT = torch.tensor([5, 7, 9, 11, 5, 7, 9, 11, 5, 7, 13, 17, 19])  # repeats: prompt lookup matches


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory) -> dict[str, object]:
    """A tiny 4-layer Llama with a word-level tokenizer, and a random head for it (taps 1, 2, 3)."""
    root = tmp_path_factory.mktemp("eagle-pipeline")
    save_tiny_llama(root / "llama", 3, layers=4)
    target = with_tokenizer(root / "llama", root / "with-tokenizer")
    head = write_checkpoint(tiny_head(VOCAB, 48, (1, 2, 3), scale=1.0), root / "head")
    return {"target": str(target), "head": str(head)}


def pipeline(model_dirs, drafter: str, head: str | None = None, **overrides):
    config = load_config(
        None,
        {
            "target.path": model_dirs["target"],
            "target.n_positions": 256,
            "draft.path": head or model_dirs["head"],
            "speculation.drafter": drafter,
            "speculation.policy": "fixed",
            "speculation.k": 4,
            "speculation.ngram_max": 3,
            **overrides,
        },
    )
    loaded = load_pipeline(config, max_batch=2)
    loaded.eos_token_ids.clear()  # random weights: an early EOS would leave nothing to compare
    return loaded


@pytest.mark.parametrize("drafter", ["eagle3", "ngram+eagle3"])
def test_a_config_drafts_with_the_head_and_greedy_output_is_plain_decodings(model_dirs, drafter):
    loaded = pipeline(model_dirs, drafter)
    expected_type = EagleDrafter if drafter == "eagle3" else LookupOrHead
    assert isinstance(loaded.shared.drafter, expected_type)
    plain = plain_generate(loaded.target, PROMPT, 30, SamplingConfig())
    result = loaded.generate_ids(PROMPT, 30)
    assert result.tokens == plain.tokens and result.stats.draft_tokens > 0
    sampled = SamplingConfig(temperature=0.9, seed=4)
    assert loaded.generate_ids(PROMPT, 30, sampled).tokens == plain_generate(loaded.target, PROMPT, 30, sampled).tokens


def test_the_combined_drafter_learns_both_sources(model_dirs):
    loaded = pipeline(model_dirs, "ngram+eagle3")
    choice = loaded.shared.drafter.choice
    assert choice.head_ms > 0 and choice.cost.at(4) > 0
    choice.head_ms = 0.0  # on this tiny target a head call costs more than a target call: it would never draft
    for seed in range(3):
        loaded.generate_ids(PROMPT, 40, SamplingConfig(temperature=1.0, seed=seed))
        loaded.generate_ids(torch.tensor([3, 4, 6, 8, 10, 12, 14]), 40, SamplingConfig(temperature=1.0, seed=seed))
    assert sum(choice.lookup.judged.values()) > 0 and sum(choice.head.judged.values()) > 0


def test_the_choice_is_the_lookup_on_a_long_match_the_head_without_one_and_neither_when_drafting_costs_too_much():
    cost = WidthCost({1: 10.0, 2: 11.0, 3: 12.0, 4: 13.0})
    choice = DraftChoice(cost, head_ms=1.0)
    long_match = Draft(torch.tensor([4, 5, 6]), torch.zeros(3, VOCAB), match_len=4, deterministic=True)
    assert choice.pick(long_match, 3) == (False, 3)
    # the prior's chances 0.40, 0.64, 0.83: a third head call (1.87 tokens in 16 ms) no longer beats two (1.66 in 14)
    assert choice.pick(Draft.empty(VOCAB), 3) == (True, 2)
    assert DraftChoice(cost, head_ms=30.0).pick(Draft.empty(VOCAB), 3) == (True, 0)
    assert best_rate([0.5, 0.5], cost, 0.0) == (max(1 / 10, 1.5 / 11, 1.75 / 12), 3)


def test_the_embedded_head_is_a_clear_error_while_none_ships(monkeypatch, tmp_path):
    monkeypatch.setitem(heads.EMBEDDED_HEADS, EMBEDDED_EAGLE3, (tmp_path / "missing", "embedded:smollm2-135m-instruct"))
    with pytest.raises(RuntimeProblem) as err:
        heads.resolve_head_path(EMBEDDED_EAGLE3)
    (problem,) = err.value.problems
    assert problem.field == "draft.path" and "ships no EAGLE-3 head" in problem.rule
    assert "neuron-ssp train-draft" in problem.fix


def test_a_shipped_head_is_checked_by_its_known_answer(model_dirs, monkeypatch, tmp_path):
    shipped = write_checkpoint(tiny_head(VOCAB, 48, (1, 2, 3), scale=1.0), tmp_path / "shipped")
    monkeypatch.setitem(heads.EMBEDDED_HEADS, EMBEDDED_EAGLE3, (shipped, "embedded:smollm2-135m-instruct"))
    with pytest.raises(RuntimeProblem, match="no recorded known answer"):
        pipeline(model_dirs, "eagle3", EMBEDDED_EAGLE3)
    loaded = pipeline(model_dirs, "eagle3", model_dirs["head"])  # the same weights, loaded as a plain directory
    tokenizer = AutoTokenizer.from_pretrained(model_dirs["target"])
    recorded = head_answer.record_head_answer(loaded.shared.drafter.model, loaded.target, tokenizer, shipped)
    assert len(recorded) == 1 + head_answer.ANSWER_DRAFT
    assert isinstance(pipeline(model_dirs, "eagle3", EMBEDDED_EAGLE3).shared.drafter, EagleDrafter)
    answer = json.loads((shipped / head_answer.ANSWER_FILE).read_text())
    answer["tokens"][-1] = (answer["tokens"][-1] + 1) % VOCAB
    (shipped / head_answer.ANSWER_FILE).write_text(json.dumps(answer))
    with pytest.raises(RuntimeProblem, match="failed its known-answer check"):
        pipeline(model_dirs, "eagle3", EMBEDDED_EAGLE3)


@pytest.mark.slow
def test_the_embedded_model_drafts_with_a_head_of_its_width(use_embedded_cache, tmp_path):
    """The real taps (layers 2, 15, 27 of 30) through a random head as wide as SmolLM2-135M: greedy output is the
    embedded model's own."""
    target_dir = resolve_model_path(EMBEDDED_DEFAULT, "target.path")
    config = head_config_for(json.loads((target_dir / "config.json").read_text()), 8192)
    assert config.taps == (2, 15, 27)
    d2t, t2d = vocab_maps(torch.randperm(config.vocab_size, generator=torch.Generator().manual_seed(0))[:8192], 49152)
    head = EagleHead(config, torch.zeros(0, config.hidden_size)).to_checkpoint(d2t, t2d)
    overrides = {"speculation.drafter": "eagle3", "draft.path": str(write_checkpoint(head, tmp_path / "head"))}
    loaded = load_pipeline(load_config(None, {**overrides, "speculation.k": 4, "speculation.policy": "fixed"}))
    prompt = loaded.encode("Write a haiku about the sea.")
    result = loaded.generate_ids(prompt, 24)
    assert result.tokens == plain_generate(loaded.target, prompt, 24, SamplingConfig(), loaded.eos_token_ids).tokens
    assert result.stats.draft_tokens > 0
