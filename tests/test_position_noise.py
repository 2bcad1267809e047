"""Randomness per (seed, position): pure, and drawn by the exponential race with each token's probability."""

from __future__ import annotations

import torch
from scipy.stats import chisquare, kstest

from neuron_ssp.speculation.position_noise import PositionNoise, draw, exponentials, position_key, race
from neuron_ssp.speculation.sampling import SamplingParams, logits_to_probs


def test_a_position_gets_the_same_noise_whatever_was_asked_before():
    keys = [position_key(123, i) for i in range(50)]
    assert [position_key(123, i) for i in reversed(range(50))] == keys[::-1]
    assert len(set(keys)) == 50 and all(0 <= key < 2**63 for key in keys)
    assert torch.equal(PositionNoise(123, 10).at(5, 8), exponentials(123, 15, 8))
    assert torch.equal(PositionNoise(123).shifted(15).at(0, 8), exponentials(123, 15, 8))
    assert not torch.equal(exponentials(124, 3, 8), exponentials(123, 3, 8))
    assert position_key(2**64 + 5, 0) == position_key(5, 0)  # seeds are taken modulo 2^64


def test_the_noise_is_exponential():
    values = torch.cat([exponentials(seed, position, 50) for seed in range(20) for position in range(20)])
    assert bool((values >= 0).all())
    assert kstest(values.numpy(), "expon").pvalue > 1e-3


def test_the_race_draws_each_token_with_its_probability():
    probs = torch.tensor([0.5, 0.0, 0.2, 0.3, 0.0])
    draws = [race(probs, exponentials(7, i, 5)) for i in range(6000)]
    counts = torch.bincount(torch.tensor(draws), minlength=5)
    assert counts[1] == counts[4] == 0  # a token of probability 0 never comes out
    assert chisquare(counts[[0, 2, 3]].numpy(), [3000.0, 1200.0, 1800.0]).pvalue > 1e-3


def test_draw_is_plain_sampling_at_that_position():
    logits = torch.randn(64, generator=torch.Generator().manual_seed(0))
    params = SamplingParams(temperature=0.8, top_p=0.9)
    noise = PositionNoise(5, 3)
    assert draw(logits, params, noise, 2) == race(logits_to_probs(logits, params), exponentials(5, 5, 64))
    assert draw(logits, SamplingParams(), noise) == int(logits.argmax())
