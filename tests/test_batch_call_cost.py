"""The batching loop prices a step's call as the backend will run it: each decoding row from its own position,
each prompt chunk as the segment it is, so goodput sees a long-context row cost more."""

from __future__ import annotations

import torch
from test_batching import SLOTS, SlotTables, draft_table
from test_chunked_prefill import ChunkedTables

from neuron_ssp.backends.base import SlotView
from neuron_ssp.config import SamplingConfig
from neuron_ssp.drafters import ModelDrafter
from neuron_ssp.engines import continuous_batch as batch_module
from neuron_ssp.engines.base import sampling_params
from neuron_ssp.engines.continuous_batch import ContinuousBatchLoop
from neuron_ssp.engines.rows import RowRequest, RowSettings
from neuron_ssp.speculation.acceptors import ProbabilisticAcceptor
from neuron_ssp.speculation.call_cost import WidthCost
from neuron_ssp.speculation.cost_policy import AcceptanceModel
from neuron_ssp.speculation.policies import CostPolicy

K = 4
GREEDY = SamplingConfig(temperature=0.0)


def test_goodput_is_given_each_rows_position_and_each_prompt_chunk(monkeypatch):
    target = ChunkedTables(SLOTS, chunk=4)
    seen: list[tuple[int, list[int], list[tuple[int, int]]]] = []  # (the call it priced, starts, prompt chunks)
    choose = batch_module.goodput_windows

    def recording(chances, cost, starts, others):
        seen.append((len(target.calls), list(starts), list(others)))
        return choose(chances, cost, starts, others)

    monkeypatch.setattr(batch_module, "goodput_windows", recording)
    draft = SlotTables(draft_table, SLOTS)
    cost = WidthCost({1: 10.0, 16: 12.0}, per_position_ms=0.01, per_row_position_ms=0.001)
    counts, params = AcceptanceModel(), sampling_params(GREEDY)

    def request(prompt: list[int]) -> RowRequest:
        rng = torch.Generator().manual_seed(0)
        settings = RowSettings(
            params,
            0,
            lambda slot: ModelDrafter(SlotView(draft, slot), params, rng),
            ProbabilisticAcceptor(params, rng),
            CostPolicy(K, cost, counts),
        )
        return RowRequest(torch.tensor(prompt), 60, set(), settings)

    loop = ContinuousBatchLoop(target, K, cost)
    loop.join(request([1, 5, 7]))
    for _ in range(3):
        loop.step()
    loop.join(request([2, 4, 6, 8, 9, 1, 3, 3, 5]))  # three chunks of 4, 4 and 1 beside the first row
    for _ in range(3):
        loop.step()
    assert len(seen) >= 5 and any(others for _, _, others in seen)
    for call, starts, others in seen:
        segments = target.calls[call]  # the call this choice was for: (slot, start, tokens) per segment
        assert others == [(start, tokens) for _, start, tokens in segments[: len(others)]]
        assert starts == [start for _, start, _ in segments[len(others) :]]
