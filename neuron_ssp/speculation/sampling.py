"""Logits -> probabilities with temperature / top-k / top-p, and sampling from them.

Speculative sampling is lossless only if the draft and the target distributions go through the very
same transform, so every caller (plain decoding, drafters, acceptors) uses these functions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 means greedy (a point mass on the argmax)."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0  # tokens below min_p x the top token's probability dropped (after temperature, as vLLM)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def logits_to_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Rows of logits (..., V) -> rows of probabilities after the sampling transform."""
    logits = logits.float()
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).to(logits.dtype)
    # each row's max subtracted before dividing, and the temperature kept above fp32's smallest normal: the
    # same distribution, and a temperature so small (a client may send 1e-206, 0 in fp32) that
    # logits / temperature overflow leaves the argmax rather than NaN (inf - inf, 0 / 0)
    temperature = max(params.temperature, torch.finfo(logits.dtype).tiny)
    logits = (logits - logits.amax(-1, keepdim=True)) / temperature
    if params.min_p > 0.0:  # p / p_max < min_p <=> (scaled logit - scaled max) < log(min_p)
        logits = logits.masked_fill(logits < math.log(params.min_p), float("-inf"))
    if params.top_k > 0 and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        drop_sorted = cumulative - sorted_logits.softmax(-1) >= params.top_p  # keep the token crossing top_p
        # and always the most likely one: a top_p below fp32's smallest value (1e-46) compares as 0, which
        # dropped every token, and sampling from nothing was NaN
        drop_sorted[..., 0] = False
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row of `probs` (..., V) -> (...,) int64, drawn with the caller's generator."""
    flat = probs.reshape(-1, probs.shape[-1])
    tokens = torch.multinomial(flat, 1, generator=generator).squeeze(-1)
    return tokens.reshape(probs.shape[:-1])


def next_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """The plain-decoding step: one token from one row of logits."""
    if params.greedy:
        return int(logits.argmax(-1))
    return int(sample(logits_to_probs(logits, params), generator))


def first_non_finite_row(logits: torch.Tensor) -> int | None:
    """Index of the first row of a (n, V) tensor that no distribution can come from: one holding NaN
    or +inf, or nothing but -inf. None when every row is usable (-inf alone marks an impossible token).

    NaN compares False with everything, so a NaN that reached the acceptor would be accepted or
    sampled silently; callers turn a hit into an error that names the position. Every row's sum is
    finite exactly when the row holds no NaN or inf (short of an overflow, which then takes the
    full check): one pass over the logits in the usual case, not five.
    """
    if bool(logits.sum(-1).isfinite().all()):
        return None
    bad = (logits.isnan() | logits.isposinf()).any(-1) | logits.isneginf().all(-1)
    hits = bad.nonzero()
    return int(hits[0]) if hits.numel() else None
