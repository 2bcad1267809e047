"""Drafters: prompt lookup matches, and the model drafter feeds only what its cache lacks."""

from __future__ import annotations

import torch
from conftest import TableBackend

from neuron_ssp.drafters import ModelDrafter
from neuron_ssp.drafters.ngram import lookup_match
from neuron_ssp.speculation.sampling import SamplingParams


def test_lookup_prefers_the_longest_ngram_then_the_latest_match():
    seq = torch.tensor([1, 2, 3, 9, 9, 2, 3, 8, 7, 1, 2, 3])
    assert lookup_match(seq, 3, ngram_max=3, ngram_min=1)[0].tolist() == [9, 9, 2]  # 3-gram [1,2,3] at 0
    seq2 = torch.tensor([5, 3, 4, 6, 3, 4, 7, 3])
    assert lookup_match(seq2, 2, ngram_max=3, ngram_min=1)[0].tolist() == [4, 7]  # latest 1-gram [3]


def test_lookup_without_a_match_proposes_nothing():
    assert lookup_match(torch.tensor([1, 2, 3, 4]), 3, 3, 1)[0].numel() == 0
    assert lookup_match(torch.tensor([1]), 3, 3, 1)[0].numel() == 0


def test_model_drafter_feeds_only_uncached_tokens():
    draft = TableBackend(16, 0)
    drafter = ModelDrafter(draft, SamplingParams(), None)
    prompt = torch.tensor([1, 2, 3, 4])
    drafter.begin(prompt, 16)
    out = drafter.propose(torch.cat([prompt, torch.tensor([5])]), 3)
    assert len(out) == 3 and out.logits.shape == (3, 16)
    assert draft.calls == [(0, 4), (4, 1), (5, 1), (6, 1)]
    # the target accepted all 3 drafts and added one: the last draft and the bonus are new to the cache
    committed = torch.cat([prompt, torch.tensor([5]), out.tokens, torch.tensor([0])])
    drafter.propose(committed, 1)
    assert draft.calls[-1] == (7, 2)


def test_draft_confidence_stops_early():
    drafter = ModelDrafter(TableBackend(16, 0, sharpness=0.01), SamplingParams(), None, stop_below=0.5)
    drafter.begin(torch.tensor([1, 2]), 16)  # near-uniform: top prob ~ 1/16
    out = drafter.propose(torch.tensor([1, 2, 3]), 3)
    assert len(out) == 0
