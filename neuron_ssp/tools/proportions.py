"""Binomial proportions with scipy.stats: a 95% interval for one (Wald, Wilson or Clopper-Pearson), and
a test of whether two differ.

dust-tt/llama2-ssp reported Wald intervals; Wald collapses to a point at 0/n or n/n (exactly what a
small eval prints), so Wilson is the default and Clopper-Pearson (exact, conservative) is offered too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from neuron_ssp.tools.extra import scipy_stats

IntervalMethod = Literal["wald", "wilson", "clopper-pearson"]
INTERVAL_METHODS: tuple[IntervalMethod, ...] = ("wald", "wilson", "clopper-pearson")
CONFIDENCE = 0.95


@dataclass(frozen=True)
class Proportion:
    successes: int
    trials: int

    @property
    def value(self) -> float:
        return self.successes / self.trials if self.trials else 0.0

    def interval(self, method: IntervalMethod = "wilson", confidence: float = CONFIDENCE) -> tuple[float, float]:
        """A two-sided interval for the true proportion; [0, 1] when there are no trials."""
        if not self.trials:
            return 0.0, 1.0
        stats = scipy_stats()
        if method == "wald":  # p ± z·sqrt(p(1-p)/n), clipped: zero width at p = 0 or 1
            half = stats.norm.ppf(0.5 + confidence / 2) * math.sqrt(self.value * (1.0 - self.value) / self.trials)
            return max(0.0, self.value - half), min(1.0, self.value + half)
        scipy_method = "exact" if method == "clopper-pearson" else method
        ci = stats.binomtest(self.successes, self.trials).proportion_ci(confidence, method=scipy_method)
        return float(ci.low), float(ci.high)

    @property
    def wald_95(self) -> tuple[float, float]:
        return self.interval("wald")


@dataclass(frozen=True)
class ZTest:
    z: float
    p_value: float  # two-sided

    def differ(self, level: float = 0.05) -> bool:
        return self.p_value < level


def two_proportion_z_test(a: Proportion, b: Proportion) -> ZTest:
    """Pooled two-proportion z-test of H0: both proportions are equal: the 2x2 chi-square test without
    continuity correction (z² = χ²), signed by which proportion is larger."""
    if not a.trials or not b.trials:
        return ZTest(0.0, 1.0)
    if a.successes + b.successes in (0, a.trials + b.trials):
        return ZTest(0.0, 1.0)  # both all-correct or all-wrong: no evidence of a difference
    table = [[a.successes, a.trials - a.successes], [b.successes, b.trials - b.successes]]
    result = scipy_stats().chi2_contingency(table, correction=False)
    z = math.copysign(math.sqrt(result.statistic), a.value - b.value)
    return ZTest(z, float(result.pvalue))
