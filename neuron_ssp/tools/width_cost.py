"""What one target call costs per window width, and the speedup that predicts for each k.

The Leviathan model prices a k-wide target call like a one-token call (c only counts the draft). That
holds on an accelerator idle at width 1; on a CPU a 10-wide call costs several one-token calls, and
the model with c ≈ 0 then predicts speedups the loop never reaches. So tune-k times the target once
per width (interleaved rounds, median) and predicts

    speedup(k) = τ(k) · t(1) / (E[t(w)] + c · E[m] · t(1))

with τ(k) the tokens committed per target call (measured acceptance, bonus token included), m the
drafted tokens per call and w the width each call scored: m + 1 where the backend scores any width
(torch), the compiled k where it pads to it (Neuron). On Neuron this also spares timing every k end
to end: one curve plus the acceptance of one run per k.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from neuron_ssp.backends.base import ModelBackend

ROUNDS = 7


@dataclass(frozen=True)
class WidthCost:
    ms: dict[int, float]  # window width -> median milliseconds of one target call

    def at(self, width: int) -> float:
        if width in self.ms:
            return self.ms[width]
        wider = [w for w in self.ms if w >= width]
        return self.ms[min(wider)] if wider else self.ms[max(self.ms)]


def _scorer(target: ModelBackend, width: int) -> ModelBackend:
    """The backend that scores `width` in one call (Neuron: the network compiled for that k)."""
    with_window = getattr(target, "with_window", None)
    return with_window(width) if with_window is not None and width > 1 else target


class WidthTimer:
    """Collects timed target calls per width in rounds; tune-k runs a round after each prompt's runs, so
    the timings see the same machine load as the runs they predict (a shared CPU drifts a lot)."""

    def __init__(self, target: ModelBackend, widths: list[int]):
        self.widths = sorted({1, *widths})
        self.scorers = {w: _scorer(target, w) for w in self.widths}
        self.target = target
        self.samples: dict[int, list[float]] = {w: [] for w in self.widths}
        self.rounds = 0

    @torch.inference_mode()
    def round(self, prompt_ids: torch.Tensor, repeats: int = 1) -> None:
        """Each width once per repeat, at the slot after the prompt, in an order that rotates per round."""
        start = prompt_ids.shape[0]
        tokens = prompt_ids[-1:].repeat(max(self.widths))
        self.target.prefill(prompt_ids)
        for _ in range(repeats):
            shift = self.rounds % len(self.widths)
            for w in self.widths[shift:] + self.widths[:shift]:
                begin = time.perf_counter()
                self.scorers[w].score(tokens[:w], start)
                self.samples[w].append(1000.0 * (time.perf_counter() - begin))
            self.rounds += 1

    def cost(self) -> WidthCost:
        return WidthCost({w: statistics.median(s) for w, s in self.samples.items() if s})


def measure_width_cost(target: ModelBackend, prompt_ids: torch.Tensor, widths: list[int],
                       rounds: int = ROUNDS) -> WidthCost:
    """Median ms of one target call per width after one uncounted warm-up round."""
    WidthTimer(target, widths).round(prompt_ids)  # warm-up: first calls pay one-off costs
    timer = WidthTimer(target, widths)
    timer.round(prompt_ids, rounds)
    return timer.cost()


def predicted_speedup_for_widths(tokens_per_call: float, c: float, draft_lengths: Mapping[int, int],
                                 cost: WidthCost, padded_width: int | None) -> float:
    """τ · t(1) / (E[t(w)] + c · E[m] · t(1)); `padded_width` = k where every call scores k (Neuron)."""
    calls = sum(draft_lengths.values())
    if calls == 0 or cost.at(1) <= 0:
        return 1.0
    call_ms = sum(n * cost.at(padded_width or m + 1) for m, n in draft_lengths.items()) / calls
    mean_drafted = sum(n * m for m, n in draft_lengths.items()) / calls
    return tokens_per_call * cost.at(1) / (call_ms + c * mean_drafted * cost.at(1))
