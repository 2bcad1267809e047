"""The call cost timed at load sees the batch: a target whose calls cost more with each segment's context gets its
cache-read and attention terms back from the probes, and the rows timed stop at TIMED_ROWS."""

from __future__ import annotations

import time
from collections.abc import Sequence

import pytest
import torch
from conftest import TableBackend

from neuron_ssp.backends.base import Segment
from neuron_ssp.speculation.call_cost import PROBE_CONTEXT, TIMED_ROWS, context_terms, target_cost, timing_clock

PER_POSITION_MS, PER_ROW_POSITION_MS = 0.004, 0.0015


class Clock:
    """A clock the fake target advances by what its calls cost: timing without the machine's noise."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


class ContextPricedTable(TableBackend):
    """A table LM whose calls take 2 ms + 0.5 ms a row + the context terms, on `clock`: a known cost to recover."""

    def __init__(self, slots: int, clock: Clock):
        super().__init__(16, 0, n_positions=2048)
        self.slots = slots
        self.clock = clock

    def score_batch(self, segments: Sequence[Segment]) -> torch.Tensor:
        rows = sum(len(s.tokens) for s in segments)
        contexts = [(s.start + len(s.tokens), len(s.tokens)) for s in segments]
        ms = 2.0 + 0.5 * rows
        ms += sum(PER_POSITION_MS * c + PER_ROW_POSITION_MS * n * c for c, n in contexts)
        self.clock.now += ms / 1000
        return torch.zeros(rows, self.vocab_size)


@pytest.mark.parametrize("slots", [1, 4])
def test_the_probes_recover_the_cost_of_a_segments_context(slots):
    clock = Clock()
    a, b = context_terms(ContextPricedTable(slots, clock), 8, 3, clock.perf_counter)
    assert a == pytest.approx(PER_POSITION_MS, rel=1e-6)
    assert b == pytest.approx(PER_ROW_POSITION_MS, rel=1e-6)


def test_a_target_with_no_context_cost_gets_none_and_a_short_cache_is_not_probed():
    a, b = context_terms(TableBackend(16, 0), 8, rounds=3)  # instant calls whatever the context
    assert a < 1e-3 and b < 1e-3
    assert context_terms(TableBackend(16, 0, n_positions=70), 8, rounds=1) == (0.0, 0.0)  # nowhere far to probe


def test_rows_past_timed_rows_are_priced_on_the_line_not_timed():
    table = TableBackend(16, 0, n_positions=2048)
    cost = target_cost(table, 4, max_rows=4 * 64)
    timed = {n for start, n in table.calls if start > 0}
    assert max(timed) == TIMED_ROWS and TIMED_ROWS in cost.ms
    assert cost.at(4 * TIMED_ROWS) == pytest.approx(4 * cost.at(TIMED_ROWS))
    assert {start for start, _ in table.calls} >= {64, min(2048 - 4 - 1, PROBE_CONTEXT)}  # near and far probes


def test_a_single_thread_cpu_target_is_timed_in_its_threads_cpu_time_anything_else_in_wall_time():
    threads = torch.get_num_threads()
    cpu = TableBackend(16, 0)
    cpu.device = torch.device("cpu")
    try:
        torch.set_num_threads(1)
        assert timing_clock(cpu) is time.thread_time
        assert timing_clock(TableBackend(16, 0)) is time.perf_counter  # no device: a Neuron backend
        torch.set_num_threads(2)
        assert timing_clock(cpu) is time.perf_counter  # other threads' work would not be counted
    finally:
        torch.set_num_threads(threads)
