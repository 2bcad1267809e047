"""The Leviathan speedup model: known values, the partial-draft refinement, reading draft lengths."""

from __future__ import annotations

import pytest

from neuron_ssp.speculation.stats import GenerationStats
from neuron_ssp.tools.leviathan import (
    draft_length_counts,
    expected_tokens_per_call,
    full_draft_fraction,
    predicted_speedup,
    predicted_speedup_for_drafts,
)


@pytest.mark.parametrize(
    ("alpha", "drafted", "tokens"),
    [
        (0.5, 3, 1.875),  # 1 + .5 + .25 + .125
        (0.0, 5, 1.0),  # nothing accepted: the target's own token only
        (1.0, 4, 5.0),  # everything accepted: all drafts plus the bonus
        (0.8, 0, 1.0),  # no draft: a plain step
    ],
)
def test_expected_tokens_per_call(alpha, drafted, tokens):
    assert expected_tokens_per_call(alpha, drafted) == pytest.approx(tokens)


def test_predicted_speedup_matches_the_paper_formula():
    # α = 0.8, k = 5 (γ = 4), c = 0.05: (1 - .8^5) / .2 / (4 * .05 + 1)
    assert predicted_speedup(0.8, 5, 0.05) == pytest.approx(3.3616 / 1.2)
    assert predicted_speedup(0.7, 4, 0.0) == pytest.approx(1 + 0.7 + 0.49 + 0.343)


def test_the_draft_length_refinement_reduces_to_the_formula_for_full_drafts():
    assert predicted_speedup_for_drafts(0.6, 0.1, {4: 50}) == pytest.approx(predicted_speedup(0.6, 5, 0.1))
    assert predicted_speedup_for_drafts(0.9, 0.0, {0: 10}) == 1.0  # never drafted: plain decoding
    assert predicted_speedup_for_drafts(0.5, 0.0, {}) == 1.0
    half = predicted_speedup_for_drafts(0.5, 0.0, {0: 1, 3: 1})
    assert half == pytest.approx((1.0 + 1.875) / 2)


def test_draft_lengths_are_read_from_the_per_position_counts():
    stats = GenerationStats(k=4)
    for drafted, accepted in [(3, 3), (3, 1), (1, 0), (0, 0), (2, 2)]:
        stats.record_call(drafted, accepted, accepted + 1)
    counts = draft_length_counts(stats)
    assert counts == {3: 2, 1: 1, 0: 1, 2: 1}
    assert full_draft_fraction(counts, 4) == pytest.approx(2 / 5)
    assert full_draft_fraction({}, 4) == 0.0
