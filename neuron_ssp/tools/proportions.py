"""Binomial proportions: a 95% Wald interval for one, a two-proportion z-test for two."""

from __future__ import annotations

import math
from dataclasses import dataclass

Z_95 = 1.959963984540054  # two-sided 95% normal quantile


@dataclass(frozen=True)
class Proportion:
    successes: int
    trials: int

    @property
    def value(self) -> float:
        return self.successes / self.trials if self.trials else 0.0

    @property
    def wald_95(self) -> tuple[float, float]:
        """p ± 1.96·sqrt(p(1-p)/n), clipped to [0, 1]. Degenerate (zero width) at p = 0 or 1."""
        if not self.trials:
            return 0.0, 1.0
        half = Z_95 * math.sqrt(self.value * (1.0 - self.value) / self.trials)
        return max(0.0, self.value - half), min(1.0, self.value + half)


@dataclass(frozen=True)
class ZTest:
    z: float
    p_value: float  # two-sided

    def differ(self, level: float = 0.05) -> bool:
        return self.p_value < level


def two_proportion_z_test(a: Proportion, b: Proportion) -> ZTest:
    """Pooled two-proportion z-test of H0: both proportions are equal."""
    if not a.trials or not b.trials:
        return ZTest(0.0, 1.0)
    pooled = (a.successes + b.successes) / (a.trials + b.trials)
    se = math.sqrt(pooled * (1.0 - pooled) * (1.0 / a.trials + 1.0 / b.trials))
    if se == 0.0:
        return ZTest(0.0, 1.0)  # both all-correct or all-wrong: no evidence of a difference
    z = (a.value - b.value) / se
    return ZTest(z, math.erfc(abs(z) / math.sqrt(2.0)))
