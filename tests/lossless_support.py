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


def block_p_values(tokens: torch.Tensor, exact_pairs: list[torch.Tensor], vocab: int) -> dict[str, float]:
    """The p-value of each generated token's marginal and each neighbouring pair's joint, by name, for samples
    `tokens` (samples, new) against `exact_pairs[j]` = P(token j-1, token j) as (V, V) (token 0: the prompt's last)."""
    found = {}
    for j in range(tokens.shape[1]):
        observed = torch.bincount(tokens[:, j], minlength=vocab).double()
        found[f"token {j + 1}"] = chi_square_p_value(observed, exact_pairs[j].sum(0))
    for j in range(1, tokens.shape[1]):
        observed = torch.bincount(tokens[:, j - 1] * vocab + tokens[:, j], minlength=vocab * vocab).double()
        found[f"tokens {j},{j + 1}"] = chi_square_p_value(observed, exact_pairs[j].flatten())
    return found
