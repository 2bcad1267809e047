"""Total-variation distance between two samples of discrete outcomes, with an upper confidence bound
and a permutation test (scipy.stats.permutation_test).

- TV(P̂, Q̂) = ½ Σ |P̂(x) - Q̂(x)| over the empirical distributions.
- Upper bound (McDiarmid): changing one of the n_a (n_b) samples moves TV(P̂, Q̂) by at most 1/n_a
  (1/n_b), and E[TV(P̂, Q̂)] >= TV(P, Q) (TV is convex), so with probability >= 1-δ
  TV(P, Q) <= TV(P̂, Q̂) + sqrt(ln(1/δ) · (1/n_a + 1/n_b) / 2). No assumption on the support size.
- The estimate is biased upwards (two samples of one distribution differ too): the permutation test
  shows the TV that equal distributions give at these sample sizes, and its p-value.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from neuron_ssp.tools.extra import scipy_stats


@dataclass(frozen=True)
class TvEstimate:
    tv: float
    upper_bound: float
    confidence: float
    null_tv_mean: float  # TV between random re-splits of the pooled samples (what "no difference" looks like)
    p_value: float  # share of re-splits with TV >= the observed one


def tv_distance(a: Sequence[Hashable], b: Sequence[Hashable]) -> float:
    codes_a, codes_b, kinds = _codes(a, b)
    return _tv(codes_a, codes_b, kinds)


def tv_upper_bound(tv: float, n_a: int, n_b: int, confidence: float = 0.95) -> float:
    margin = math.sqrt(math.log(1.0 / (1.0 - confidence)) * (1.0 / n_a + 1.0 / n_b) / 2.0)
    return min(1.0, tv + margin)


def estimate_tv(
    a: Sequence[Hashable], b: Sequence[Hashable], confidence: float = 0.95, permutations: int = 500, seed: int = 0
) -> TvEstimate:
    codes_a, codes_b, kinds = _codes(a, b)
    observed = _tv(codes_a, codes_b, kinds)
    test = scipy_stats().permutation_test(
        (codes_a, codes_b),
        lambda x, y: _tv(x, y, kinds),
        permutation_type="independent",
        vectorized=False,
        n_resamples=permutations,
        alternative="greater",
        rng=np.random.default_rng(seed),
    )
    return TvEstimate(
        observed,
        tv_upper_bound(observed, len(a), len(b), confidence),
        confidence,
        float(np.mean(test.null_distribution)),
        float(test.pvalue),
    )


def _codes(a: Sequence[Hashable], b: Sequence[Hashable]) -> tuple[np.ndarray, np.ndarray, int]:
    """Both samples as small integer codes, and the number of codes."""
    codes = {x: i for i, x in enumerate(dict.fromkeys([*a, *b]))}
    return np.array([codes[x] for x in a]), np.array([codes[x] for x in b]), len(codes)


def _tv(a: np.ndarray, b: np.ndarray, kinds: int) -> float:
    """TV between the empirical distributions of two code arrays."""
    p = np.bincount(a, minlength=kinds) / len(a)
    q = np.bincount(b, minlength=kinds) / len(b)
    return 0.5 * float(np.abs(p - q).sum())
