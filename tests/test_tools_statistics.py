"""Wald intervals, the two-proportion z-test and the total-variation estimator."""

from __future__ import annotations

import math

import pytest
import torch

from neuron_ssp.tools.proportions import Proportion, two_proportion_z_test
from neuron_ssp.tools.tv_distance import estimate_tv, tv_distance, tv_upper_bound


def test_wald_interval_known_values():
    low, high = Proportion(50, 100).wald_95
    assert (low, high) == pytest.approx((0.5 - 0.0980, 0.5 + 0.0980), abs=1e-4)
    assert Proportion(0, 10).wald_95 == (0.0, 0.0)  # Wald's known degeneracy at the edges
    assert Proportion(9, 10).wald_95[1] == 1.0  # clipped
    assert Proportion(0, 0).wald_95 == (0.0, 1.0)


def test_two_proportion_z_test_known_values():
    test = two_proportion_z_test(Proportion(60, 100), Proportion(50, 100))
    assert test.z == pytest.approx(1.4213, abs=1e-3)
    assert test.p_value == pytest.approx(0.1552, abs=1e-3)
    assert not test.differ()
    assert two_proportion_z_test(Proportion(80, 100), Proportion(50, 100)).differ()
    same = two_proportion_z_test(Proportion(7, 20), Proportion(7, 20))
    assert same.z == 0.0 and same.p_value == pytest.approx(1.0)
    assert two_proportion_z_test(Proportion(10, 10), Proportion(10, 10)).p_value == 1.0


def _draw(probs: list[float], n: int, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.multinomial(torch.tensor(probs), n, replacement=True, generator=gen).tolist()


def test_tv_of_known_samples():
    assert tv_distance([0, 0, 1, 1], [0, 0, 1, 1]) == 0.0
    assert tv_distance([0, 0], [1, 1]) == 1.0
    assert tv_distance([0, 0, 0, 1], [0, 1, 1, 1]) == pytest.approx(0.5)
    assert tv_upper_bound(0.1, 1000, 1000, 0.95) == pytest.approx(0.1 + math.sqrt(math.log(20) / 1000))


def test_identical_samplers_give_a_small_tv_and_no_detected_difference():
    probs = [0.5, 0.2, 0.1, 0.1, 0.05, 0.05]
    estimate = estimate_tv(_draw(probs, 4000, 1), _draw(probs, 4000, 2), permutations=200)
    assert estimate.tv < 0.05
    assert estimate.p_value > 0.01
    assert estimate.upper_bound < 0.1


def test_clearly_different_samplers_give_a_large_tv_and_a_detected_difference():
    estimate = estimate_tv(_draw([0.5, 0.3, 0.2], 4000, 1), _draw([0.2, 0.3, 0.5], 4000, 2), permutations=200)
    assert estimate.tv == pytest.approx(0.3, abs=0.04)
    assert estimate.p_value < 0.01
    assert estimate.tv > estimate.null_tv_mean * 5


def test_wilson_and_clopper_pearson_known_values():
    """Published values (e.g. Brown, Cai & DasGupta 2001 tables; R's binom.test for the exact one)."""
    assert Proportion(0, 100).interval("wilson") == pytest.approx((0.0, 0.0370), abs=1e-4)
    assert Proportion(0, 100).interval("clopper-pearson") == pytest.approx((0.0, 0.0362), abs=1e-4)
    assert Proportion(50, 100).interval("wilson") == pytest.approx((0.4038, 0.5962), abs=1e-4)
    assert Proportion(50, 100).interval("clopper-pearson") == pytest.approx((0.3983, 0.6017), abs=1e-4)
    assert Proportion(100, 100).interval("wilson")[0] == pytest.approx(0.9630, abs=1e-4)
    assert Proportion(0, 0).interval("wilson") == (0.0, 1.0)
    assert Proportion(50, 100).interval() == Proportion(50, 100).interval("wilson")  # the default


def test_the_z_test_is_signed_and_symmetric():
    up, down = (
        two_proportion_z_test(Proportion(60, 100), Proportion(50, 100)),
        two_proportion_z_test(Proportion(50, 100), Proportion(60, 100)),
    )
    assert up.z == pytest.approx(-down.z) and up.p_value == pytest.approx(down.p_value)
    assert two_proportion_z_test(Proportion(0, 10), Proportion(0, 10)).p_value == 1.0
