"""The drafter registry (drafters/registry.py) against what the rest of the package says of each drafter."""

from __future__ import annotations

import typing

import torch
from conftest import backend, tiny_llama

from neuron_ssp.config import DRAFTERS_WITH_DRAFT, EAGLE_DRAFTERS, DrafterName, SuffixConfig
from neuron_ssp.drafters import ModelDrafter, NgramDrafter, SuffixDrafter, SuffixHistory
from neuron_ssp.drafters.base import PerRow, ReadsHiddenStates, SamplesDrafts
from neuron_ssp.drafters.registry import DRAFTERS, drafter_kind
from neuron_ssp.speculation.sampling import SamplingParams


def test_every_configurable_drafter_is_described_and_nothing_else():
    assert set(DRAFTERS) == set(typing.get_args(DrafterName))


def test_the_config_layer_names_the_same_drafters_as_needing_a_draft_path():
    assert {name for name, kind in DRAFTERS.items() if kind.needs_draft_path} == set(DRAFTERS_WITH_DRAFT)
    assert {name for name, kind in DRAFTERS.items() if kind.head} == set(EAGLE_DRAFTERS)


def test_the_drafters_behave_as_described():
    """Sampling drafters take a row's mask, point-mass ones do not; stateful ones make a drafter per row."""
    draft = backend(tiny_llama(1))
    model = ModelDrafter(draft, SamplingParams(), None)
    assert drafter_kind("model").samples and isinstance(model, SamplesDrafts) and isinstance(model, PerRow)
    ngram = NgramDrafter(97)
    assert not drafter_kind("ngram").samples and not isinstance(ngram, SamplesDrafts | PerRow)
    suffix = SuffixDrafter(97, SuffixConfig(), SuffixHistory(SuffixConfig()))
    assert drafter_kind("suffix").learns and isinstance(suffix, PerRow) and not isinstance(suffix, SamplesDrafts)
    row = suffix.for_row(3, SamplingParams(), None)
    assert row is not suffix and row.history is suffix.history  # a fresh tree over the shared history
    assert not isinstance(ngram, ReadsHiddenStates) and drafter_kind("eagle3").hidden_states
    assert model.for_row(2, SamplingParams(), torch.Generator()).backend.slot == 2
    assert not drafter_kind("none").drafts and drafter_kind("ngram").drafts
