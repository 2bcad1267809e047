"""Total-variation distance between two samples of discrete outcomes, with an upper confidence bound
and a permutation test.

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

import torch


@dataclass(frozen=True)
class TvEstimate:
    tv: float
    upper_bound: float
    confidence: float
    null_tv_mean: float  # TV between random re-splits of the pooled samples (what "no difference" looks like)
    p_value: float  # share of re-splits with TV >= the observed one


def tv_distance(a: Sequence[Hashable], b: Sequence[Hashable]) -> float:
    pooled, kinds = _pooled_codes(a, b)
    return _split_tv(pooled, len(a), kinds)


def tv_upper_bound(tv: float, n_a: int, n_b: int, confidence: float = 0.95) -> float:
    margin = math.sqrt(math.log(1.0 / (1.0 - confidence)) * (1.0 / n_a + 1.0 / n_b) / 2.0)
    return min(1.0, tv + margin)


def estimate_tv(a: Sequence[Hashable], b: Sequence[Hashable], confidence: float = 0.95,
                permutations: int = 500, seed: int = 0) -> TvEstimate:
    pooled, kinds = _pooled_codes(a, b)
    n_a, n_b = len(a), len(b)
    observed = _split_tv(pooled, n_a, kinds)
    gen = torch.Generator().manual_seed(seed)
    null = [_split_tv(pooled[torch.randperm(n_a + n_b, generator=gen)], n_a, kinds) for _ in range(permutations)]
    p_value = (1 + sum(t >= observed - 1e-12 for t in null)) / (1 + permutations)
    return TvEstimate(observed, tv_upper_bound(observed, n_a, n_b, confidence), confidence,
                      sum(null) / len(null) if null else 0.0, p_value)


def _pooled_codes(a: Sequence[Hashable], b: Sequence[Hashable]) -> tuple[torch.Tensor, int]:
    """Both samples as one tensor of small integer codes (a first, then b), and the number of codes."""
    codes = {x: i for i, x in enumerate(dict.fromkeys([*a, *b]))}
    return torch.tensor([codes[x] for x in [*a, *b]], dtype=torch.long), len(codes)


def _split_tv(pooled: torch.Tensor, n_a: int, kinds: int) -> float:
    """TV between the empirical distributions of pooled[:n_a] and pooled[n_a:]."""
    p = torch.bincount(pooled[:n_a], minlength=kinds).double() / n_a
    q = torch.bincount(pooled[n_a:], minlength=kinds).double() / (pooled.shape[0] - n_a)
    return 0.5 * float((p - q).abs().sum())
