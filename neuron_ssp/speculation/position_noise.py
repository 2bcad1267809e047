"""Randomness per (seed, position): what makes a seeded request reproducible whatever else happens.

A shared random stream hands out numbers in the order they are asked for, so the windows (which the
cost policy takes from timings), the batch around a request and the number of rejections would all
change which number lands at which output position. Here output position i of a request always gets
the same noise: one exponential E_t per vocabulary token, from a generator seeded by a hash (splitmix64)
of (seed, i), and the token drawn is argmax_t p_t / E_t, which is t with probability p_t (the exponential
race, i.e. the Gumbel-max trick: log p_t - log E_t is log p_t plus Gumbel noise).

Plain decoding draws token i as `draw(p_i, noise i)`. A speculative step judges drafted token d at
position i by drawing from the target's p_i with the same noise and keeping d exactly when the two are
equal, otherwise committing the drawn token: the committed tokens are then plain sampling's, token for
token, whatever the windows, the policy, the timing or the batch, and lossless for that reason alone.
For a point-mass draft (prompt lookup, suffix) d is kept with probability p_i(d) and the replacement is
p_i without d, i.e. rejection sampling's law. A draft model draws its own token at i from its q_i with
the same noise (Gumbel-max coupling): it agrees with the target's draw with probability at least
(1 - TV) / (1 + TV), a little below rejection sampling's 1 - TV (TV: total variation of p_i and q_i).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from neuron_ssp.speculation.sampling import SamplingParams, logits_to_probs

_MASK = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def position_key(seed: int, position: int) -> int:
    """A 63-bit generator seed, a pure function of (seed, position) (any integer seed, taken modulo 2^64)."""
    return _splitmix64(_splitmix64(seed & _MASK) ^ (position & _MASK)) >> 1


def exponentials(seed: int, position: int, vocab_size: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """(vocab_size,) float64 Exp(1) noise of one position, on `device` (CUDA draws there)."""
    generator = torch.Generator(device=device).manual_seed(position_key(seed, position))
    return torch.rand(vocab_size, generator=generator, dtype=torch.float64, device=device).neg_().log1p_().neg_()


def race(probs: torch.Tensor, noise: torch.Tensor) -> int:
    """argmax p / E: a token of probability 0 never wins (0 / E = 0 < p / E for some p > 0)."""
    return int((probs.double() / noise).argmax())


@dataclass(frozen=True)
class PositionNoise:
    """One request's noise: `first` is the output position of the first row it is asked about (a window
    of the loop starts where the request's committed output ends)."""

    seed: int
    first: int = 0

    def at(self, offset: int, vocab_size: int, device: torch.device | str = "cpu") -> torch.Tensor:
        return exponentials(self.seed, self.first + offset, vocab_size, device)

    def shifted(self, first: int) -> PositionNoise:
        return PositionNoise(self.seed, first)


def draw(logits: torch.Tensor, params: SamplingParams, noise: PositionNoise, offset: int = 0) -> int:
    """The token plain sampling emits at `noise.first + offset` from one row of logits (greedy: the argmax)."""
    if params.greedy:
        return int(logits.argmax(-1))
    return race(logits_to_probs(logits, params), noise.at(offset, logits.shape[-1], logits.device))
