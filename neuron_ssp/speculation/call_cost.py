"""What one target call costs: per window width (rows of one sequence), and with many sequences at their context
lengths. Measured on the loaded target, used by the cost policy and the batch's goodput to choose windows and by
tune-k to predict each k's speedup (tools/width_cost.py).

A curve is timed in rounds (each width once per round, the order rotating), medians per width, after
one uncounted warm-up round: first calls pay one-off costs, and a shared machine drifts. On Neuron a
window narrower than the compiled k pads to it, so `_scorer` takes the network compiled for the width.

A call of many sequences costs more than the same rows of one: each segment's attention reads its own slot's
cache, every position before its rows (a batch of S decoding sequences at context C reads S caches of C
positions each), and each row computes its attention over those positions. So the cost of a call whose segment s
scores rows_s tokens from position start_s (context C_s = start_s + rows_s) is

    t = W(n) + a * (sum_s C_s - C_w(n)) + b * (sum_s rows_s * C_s - n * C_w(n)),    n = sum_s rows_s

with W(n) the width curve (n rows of one segment at context C_w(n) = timed_start + n), a the cost per position of
a segment's cache read and b the cost per row and position of its attention. a and b are timed at load beside the
curve (`context_terms`): S segments of one row and one segment of k rows, each at two starts.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from neuron_ssp.backends.base import Segment


class Timed(Protocol):
    """What timing needs of a target: backends.base.ModelBackend has it (named here, not imported: the loop's
    pieces name only what they use of a backend; they share its interface's types, Segment)."""

    vocab_size: int
    max_score_width: int | None
    n_positions: int
    slots: int

    def prefill(self, prompt_ids: torch.Tensor) -> torch.Tensor: ...

    def score(self, token_ids: torch.Tensor, start: int) -> torch.Tensor: ...

    def score_batch(self, segments: Sequence[Segment]) -> torch.Tensor: ...


ROUNDS = 7
POLICY_ROUNDS = 3  # the cost policy's curve, timed at load: 1-3 s on a CPU
POLICY_PROMPT_TOKENS = 64
TIMED_ROWS = 64  # rows past this are priced on the line through the widest timed call (a call of 128 rows on the
# row kernel is two calls of 64: row_kernel.MAX_ROWS)
PROBE_SLOTS = 8  # segments of the context probe, at most
PROBE_CONTEXT = 1024  # the far start of the context probe, at most (the near one: POLICY_PROMPT_TOKENS)


@dataclass(frozen=True)
class WidthCost:
    ms: dict[int, float]  # rows scored in one call (a window's width, or a batch's rows) -> median milliseconds
    prefill_ms: list[float] = field(default_factory=list)  # one prompt prefill per timed round
    per_position_ms: float = 0.0  # a: a segment's cache read, per position of its context
    per_row_position_ms: float = 0.0  # b: a row's attention, per position of its context
    timed_start: int = POLICY_PROMPT_TOKENS  # where the width curve's rows started

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

    def rows_ms(self, rows: int) -> float:
        """W(rows) less its own context terms: what a call of `rows` rows costs before its segments' attention.
        Never below 0: past the widest timed call W grows on a line while the context terms grow with rows
        squared, and a negative call cost would turn goodput's best rate into its worst."""
        return max(0.0, self.at(rows) - self.segment_ms(rows, self.timed_start))

    def segment_ms(self, rows: int, start: int) -> float:
        """The context terms of one segment of `rows` rows from position `start`."""
        context = start + rows
        return self.per_position_ms * context + self.per_row_position_ms * rows * context

    def added_row_ms(self, start: int, rows: int) -> float:
        """What one more row adds to the context terms of a segment of `rows` rows from `start` (its own and
        the later ones' attention over one more position): segment_ms(rows + 1) - segment_ms(rows), exactly."""
        return self.per_position_ms + self.per_row_position_ms * (start + 2 * rows + 1)

    def call_ms(self, segments: Sequence[tuple[int, int]]) -> float:
        """A call of these segments, each (first position, rows): the module docstring's t."""
        rows = sum(count for _, count in segments)
        return self.rows_ms(rows) + sum(self.segment_ms(count, start) for start, count in segments)

    @property
    def mean_prefill_ms(self) -> float:
        return statistics.fmean(self.prefill_ms) if self.prefill_ms else 0.0


def _scorer(target: Timed, width: int) -> Timed:
    """The backend that scores `width` in one call (Neuron: the network compiled for that k)."""
    with_window = getattr(target, "with_window", None)
    return with_window(width) if with_window is not None and width > 1 else target


Clock = Callable[[], float]


def timing_clock(target: Timed) -> Clock:
    """What target_cost times with: the calling thread's CPU time where the target computes on that thread alone
    (torch on a CPU, one thread), else wall time (a device, or several threads). On a machine shared with other
    jobs the wall time of a few calls moves with their load: two servers of one config, each timing its own curve,
    priced width 2 at 163 and 188 ms against width 1's 158 and 168 ms (a loaded 2-core machine, 3 rounds) and
    chose different windows; the thread's CPU time does not count the time other processes held the core."""
    device = getattr(target, "device", None)
    on_this_thread = isinstance(device, torch.device) and device.type == "cpu" and torch.get_num_threads() == 1
    return time.thread_time if on_this_thread else time.perf_counter


class WidthTimer:
    """Collects timed target calls per width in rounds; tune-k runs a round after each prompt's runs, so
    the timings see the same machine load as the runs they predict (a shared CPU drifts a lot)."""

    def __init__(self, target: Timed, widths: list[int], clock: Clock = time.perf_counter):
        self.widths = sorted({1, *widths})
        self.scorers = {w: _scorer(target, w) for w in self.widths}
        self.target = target
        self.clock = clock
        self.samples: dict[int, list[float]] = {w: [] for w in self.widths}
        self.prefill_ms: list[float] = []
        self.rounds = 0

    @torch.inference_mode()
    def round(self, prompt_ids: torch.Tensor, repeats: int = 1) -> None:
        """The prompt's prefill, then each width once per repeat at the slot after the prompt, in an order
        that rotates per round."""
        start = prompt_ids.shape[0]
        tokens = prompt_ids[-1:].repeat(max(self.widths))
        begin = self.clock()
        self.target.prefill(prompt_ids)
        self.prefill_ms.append(1000.0 * (self.clock() - begin))
        for _ in range(repeats):
            shift = self.rounds % len(self.widths)
            for w in self.widths[shift:] + self.widths[:shift]:
                begin = self.clock()
                self.scorers[w].score(tokens[:w], start)
                self.samples[w].append(1000.0 * (self.clock() - begin))
            self.rounds += 1

    def cost(self) -> WidthCost:
        return WidthCost({w: statistics.median(s) for w, s in self.samples.items() if s}, list(self.prefill_ms))


def measure_width_cost(
    target: Timed, prompt_ids: torch.Tensor, widths: list[int], rounds: int = ROUNDS, clock: Clock = time.perf_counter
) -> WidthCost:
    """Median ms of one target call per width after one uncounted warm-up round."""
    WidthTimer(target, widths, clock).round(prompt_ids)  # warm-up: first calls pay one-off costs
    timer = WidthTimer(target, widths, clock)
    timer.round(prompt_ids, rounds)
    return timer.cost()


def target_cost(target: Timed, k: int, max_rows: int | None = None) -> WidthCost:
    """The target's cost per width 1..k for the cost policy, smoothed with `affine`, per row count up to
    `max_rows` (a batch: serve.max_batch x k) at powers of two, and the context terms, timed once at load by
    whoever loads the target and passed to every policy built around it. A target that pads narrower windows to
    its compiled width (Neuron) is timed at 1 and that width only, so every width in between costs the padded
    one, and without context terms. Row counts past TIMED_ROWS are priced on the line through the widest timed."""
    padded = target.max_score_width
    widths = [1, padded] if padded else sorted({1, 2, *range(4, k, 4), k})
    batch = [] if padded or not max_rows else batch_widths(k, min(max_rows, TIMED_ROWS))
    prompt = torch.arange(POLICY_PROMPT_TOKENS) % target.vocab_size
    clock = timing_clock(target)
    measured = measure_width_cost(target, prompt, widths + batch, POLICY_ROUNDS, clock)
    if padded:
        return affine(measured, k)
    per_position, per_row_position = context_terms(target, k, POLICY_ROUNDS, clock)
    return dataclasses.replace(affine(measured, k), per_position_ms=per_position, per_row_position_ms=per_row_position)


@torch.inference_mode()
def context_terms(target: Timed, k: int, rounds: int, clock: Clock = time.perf_counter) -> tuple[float, float]:
    """(a, b) of the module docstring, >= 0: S = min(slots, PROBE_SLOTS) segments of one row, and one segment of k
    rows, each from a near and a far start, in rotating rounds after an uncounted one (medians). A slot's
    positions before the start need not hold a real prompt: the call reads them all the same. A cache that is not
    addressed by position (Hugging Face's DynamicCache) reads only what it holds, so it shows no context cost."""
    near = POLICY_PROMPT_TOKENS
    far = min(target.n_positions - k - 1, PROBE_CONTEXT)
    slots = min(target.slots, PROBE_SLOTS)
    if far <= near:
        return 0.0, 0.0
    token = torch.tensor([1 % target.vocab_size])
    probes = {
        (shape, start): [Segment(slot, start, token.repeat(rows)) for slot in range(count)]
        for shape, (count, rows) in {"slots": (slots, 1), "rows": (1, k)}.items()
        for start in (near, far)
    }
    samples: dict[tuple[str, int], list[float]] = {probe: [] for probe in probes}
    order = list(probes)
    for turn in range(rounds + 1):
        for probe in order[turn % len(order) :] + order[: turn % len(order)]:
            begin = clock()
            target.score_batch(probes[probe])
            if turn:
                samples[probe].append(1000.0 * (clock() - begin))
    ms = {probe: statistics.median(times) for probe, times in samples.items()}
    span = far - near
    per_slot = max(0.0, ms["slots", far] - ms["slots", near]) / (slots * span)  # a + b (one row a segment)
    per_window = max(0.0, ms["rows", far] - ms["rows", near]) / span  # a + k b
    per_row_position = max(0.0, (per_window - per_slot) / (k - 1)) if k > 1 else 0.0
    return max(0.0, per_slot - per_row_position), per_row_position


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
    return dataclasses.replace(cost, ms={**line, **measured})
