"""What one target call costs per window width: measured on the loaded target, used by the cost policy
to choose windows and by tune-k to predict each k's speedup (tools/width_cost.py).

A curve is timed in rounds (each width once per round, the order rotating), medians per width, after
one uncounted warm-up round: first calls pay one-off costs, and a shared machine drifts. On Neuron a
window narrower than the compiled k pads to it, so `_scorer` takes the network compiled for the width.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Protocol

import torch


class Timed(Protocol):
    """What timing needs of a target: backends.base.ModelBackend has it (the loop's pieces sit below the
    backends, so they name only what they use)."""

    vocab_size: int
    max_score_width: int | None

    def prefill(self, prompt_ids: torch.Tensor) -> torch.Tensor: ...

    def score(self, token_ids: torch.Tensor, start: int) -> torch.Tensor: ...


ROUNDS = 7
POLICY_ROUNDS = 3  # the cost policy's curve, timed at load: 1-3 s on a CPU
POLICY_PROMPT_TOKENS = 64


@dataclass(frozen=True)
class WidthCost:
    ms: dict[int, float]  # rows scored in one call (a window's width, or a batch's rows) -> median milliseconds
    prefill_ms: list[float] = field(default_factory=list)  # one prompt prefill per timed round

    def at(self, width: int) -> float:
        """Measured, else on the line between the nearest measured widths around it, else the widest's cost
        per row (a call past the widest timed one)."""
        if width in self.ms:
            return self.ms[width]
        below = [w for w in self.ms if w < width]
        above = [w for w in self.ms if w > width]
        if not above:
            widest = max(self.ms)
            return self.ms[widest] * width / widest
        if not below:
            return self.ms[min(above)]
        low, high = max(below), min(above)
        return self.ms[low] + (self.ms[high] - self.ms[low]) * (width - low) / (high - low)

    @property
    def mean_prefill_ms(self) -> float:
        return statistics.fmean(self.prefill_ms) if self.prefill_ms else 0.0


def _scorer(target: Timed, width: int) -> Timed:
    """The backend that scores `width` in one call (Neuron: the network compiled for that k)."""
    with_window = getattr(target, "with_window", None)
    return with_window(width) if with_window is not None and width > 1 else target


class WidthTimer:
    """Collects timed target calls per width in rounds; tune-k runs a round after each prompt's runs, so
    the timings see the same machine load as the runs they predict (a shared CPU drifts a lot)."""

    def __init__(self, target: Timed, widths: list[int]):
        self.widths = sorted({1, *widths})
        self.scorers = {w: _scorer(target, w) for w in self.widths}
        self.target = target
        self.samples: dict[int, list[float]] = {w: [] for w in self.widths}
        self.prefill_ms: list[float] = []
        self.rounds = 0

    @torch.inference_mode()
    def round(self, prompt_ids: torch.Tensor, repeats: int = 1) -> None:
        """The prompt's prefill, then each width once per repeat at the slot after the prompt, in an order
        that rotates per round."""
        start = prompt_ids.shape[0]
        tokens = prompt_ids[-1:].repeat(max(self.widths))
        begin = time.perf_counter()
        self.target.prefill(prompt_ids)
        self.prefill_ms.append(1000.0 * (time.perf_counter() - begin))
        for _ in range(repeats):
            shift = self.rounds % len(self.widths)
            for w in self.widths[shift:] + self.widths[:shift]:
                begin = time.perf_counter()
                self.scorers[w].score(tokens[:w], start)
                self.samples[w].append(1000.0 * (time.perf_counter() - begin))
            self.rounds += 1

    def cost(self) -> WidthCost:
        return WidthCost({w: statistics.median(s) for w, s in self.samples.items() if s}, list(self.prefill_ms))


def measure_width_cost(target: Timed, prompt_ids: torch.Tensor, widths: list[int], rounds: int = ROUNDS) -> WidthCost:
    """Median ms of one target call per width after one uncounted warm-up round."""
    WidthTimer(target, widths).round(prompt_ids)  # warm-up: first calls pay one-off costs
    timer = WidthTimer(target, widths)
    timer.round(prompt_ids, rounds)
    return timer.cost()


def target_cost(target: Timed, k: int, max_rows: int | None = None) -> WidthCost:
    """The target's cost per width 1..k for the cost policy, smoothed with `affine`, and per row count up
    to `max_rows` (a batch: serve.max_batch x k) at powers of two, timed once at load by whoever loads the
    target and passed to every policy built around it. A target that pads narrower windows to its compiled
    width (Neuron) is timed at 1 and that width only, so every width in between costs the padded one. Rows
    beyond k are timed as one sequence's rows: each weight is read once for all rows of a call, whoever's
    they are, and a row's attention reads its own slot (a batch's rows read more cache than one window's)."""
    padded = target.max_score_width
    widths = [1, padded] if padded else sorted({1, 2, *range(4, k, 4), k})
    batch = [] if padded or not max_rows else batch_widths(k, max_rows)
    prompt = torch.arange(POLICY_PROMPT_TOKENS) % target.vocab_size
    measured = measure_width_cost(target, prompt, widths + batch, POLICY_ROUNDS)
    return affine(measured, k)


def batch_widths(k: int, max_rows: int) -> list[int]:
    """Row counts past k to time for a batch: the powers of two between, and max_rows itself."""
    powers = [2**i for i in range(max_rows.bit_length()) if k < 2**i < max_rows]
    return powers + ([max_rows] if max_rows > k else [])


def affine(cost: WidthCost, k: int) -> WidthCost:
    """t(1) and t(2) as measured, t(3..k) on the least-squares line through the measured widths >= 3 (a
    wide call streams the weights once, then pays per row). One and two rows run other kernels than
    wider calls on a CPU (matrix-vector and MKL's small GEMM on the weights as stored, then the packed
    GEMM), so they stay off the line. A few timed calls per width on a shared machine jump by 20 % from
    one width to the next; the line does not. With one measured width >= 3 (Neuron: the compiled k) the
    line is flat; a slope below 0 is noise and becomes 0. Row counts past k (a batch's) stay as measured."""
    wide = sorted((w, ms) for w, ms in cost.ms.items() if 3 <= w <= k)
    if not wide:
        return cost
    mean_w = statistics.fmean(w for w, _ in wide)
    mean_ms = statistics.fmean(ms for _, ms in wide)
    spread = sum((w - mean_w) ** 2 for w, _ in wide)
    slope = max(0.0, sum((w - mean_w) * (ms - mean_ms) for w, ms in wide) / spread) if spread else 0.0
    line = {w: mean_ms + slope * (w - mean_w) for w in range(2, max(k, 2) + 1)}
    measured = {w: ms for w, ms in cost.ms.items() if w <= 2 or w > k}
    return WidthCost({**line, **measured}, cost.prefill_ms)
