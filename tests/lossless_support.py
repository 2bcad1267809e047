"""The goodness-of-fit test the losslessness tests share (tests/test_lossless.py, tests/test_nxdi_lossless.py)."""

from __future__ import annotations

import torch
from scipy import stats


def chi_square_p_value(observed: torch.Tensor, expected_probs: torch.Tensor) -> float:
    """Pearson chi-square goodness of fit; cells with an expected count < 5 pooled into one."""
    n = float(observed.sum())
    expected = expected_probs * n
    keep = expected >= 5
    obs = torch.cat([observed[keep], observed[~keep].sum().view(1)])
    exp = torch.cat([expected[keep], expected[~keep].sum().view(1)])
    nonzero = exp > 0
    obs, exp = obs[nonzero], exp[nonzero]
    return float(stats.chisquare(obs.numpy(), exp.numpy() * (obs.sum() / exp.sum()).item()).pvalue)
