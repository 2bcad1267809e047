"""Chunked prefill: a joining prompt is scored `prompt_chunk` tokens per step in the running rows' call, so they
go on committing tokens while it is prefilled, and its output is the one it gets alone.

On a tiny Llama through the compact forward (the row kernel where it is built: bit-identical rows whatever the
chunking); the call structure on table LMs held per slot (test_batching.SlotTables)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch
from conftest import TableBackend, tiny_llama
from test_batched_scoring import needs_kernel
from test_batching import SlotTables

from neuron_ssp.backends.base import Segment
from neuron_ssp.backends.torch.scoring import TorchBackend
from neuron_ssp.config import SamplingConfig
from neuron_ssp.engines.base import sampling_params
from neuron_ssp.engines.continuous_batch import ContinuousBatchLoop
from neuron_ssp.engines.rows import RowCallbacks, RowRequest, RowSettings

VOCAB, CHUNK = 16, 4
GREEDY = sampling_params(SamplingConfig(temperature=0.0))


class ChunkedTables(SlotTables):
    """SlotTables that prefill in chunks: each segment's logits cut to its `returned_rows`."""

    def __init__(self, slots: int, chunk: int):
        super().__init__(lambda: TableBackend(VOCAB, 0), slots)
        self.prompt_chunk = chunk
        self.returned: list[list[int]] = []

    def score_batch(self, segments: Sequence[Segment]) -> torch.Tensor:
        logits = super().score_batch(segments)
        self.returned.append([s.returned_rows for s in segments])
        rows = logits.split([len(s.tokens) for s in segments])
        return torch.cat([part[len(part) - s.returned_rows :] for part, s in zip(rows, segments, strict=True)])


def row(prompt: list[int], budget: int, stop: list[bool] | None = None) -> RowRequest:
    stop_check = (lambda: stop[0]) if stop else None
    return RowRequest(
        torch.tensor(prompt), budget, settings=RowSettings(GREEDY), callbacks=RowCallbacks(should_stop=stop_check)
    )


def test_a_joining_prompt_is_scored_in_chunks_beside_the_running_rows():
    target = ChunkedTables(slots=3, chunk=CHUNK)
    loop = ContinuousBatchLoop(target, k=1)
    first = loop.join(row([1, 2, 3], 20))
    assert not first.finished and first.prefilling  # nothing scored at join: its chunk goes with the next step
    loop.step()
    assert target.calls[-1] == [(first.slot, 0, 3)] and target.returned[-1] == [1]
    assert first.seq.generated_count == 1
    second = loop.join(row(list(range(1, 11)), 20))  # 10 tokens: chunks of 4, 4 and 2
    for chunk_start, chunk_rows in ((0, 4), (4, 4), (8, 2)):
        before = first.seq.generated_count
        loop.step()
        # one call: the prompt chunk, and the running row's token (it does not wait for the prefill)
        assert target.calls[-1] == [(second.slot, chunk_start, chunk_rows), (first.slot, first.seq.length - 2, 1)]
        assert target.returned[-1] == [int(chunk_start + chunk_rows == 10), 1]  # head only for the prompt's last
        assert first.seq.generated_count == before + 1
    assert not second.prefilling and second.seq.generated_count == 1


def test_the_chunk_budget_is_shared_first_come_first_served():
    target = ChunkedTables(slots=3, chunk=CHUNK)
    loop = ContinuousBatchLoop(target, k=1)
    a, b = loop.join(row([1, 2, 3, 4, 5, 6], 5)), loop.join(row([7, 8, 9], 5))
    loop.step()
    assert target.calls[-1] == [(a.slot, 0, 4)]
    loop.step()
    assert target.calls[-1] == [(a.slot, 4, 2), (b.slot, 0, 2)]
    loop.step()
    assert target.calls[-1] == [(b.slot, 2, 1), (a.slot, 6, 1)]
    assert (a.seq.generated_count, b.seq.generated_count) == (2, 1)


def test_chunked_rows_equal_their_requests_alone_and_a_cancel_while_prefilling_frees_the_slot():
    prompts = [[1, 5, 7, 9, 5, 2, 2, 8, 1], [2, 4], [7, 7, 1, 2, 9, 4, 4, 6, 6, 1, 3], [5]]
    budgets = [12, 9, 1, 15]
    alone = [
        ContinuousBatchLoop(TableBackend(VOCAB, 0), 1).run(row(p, n)).tokens
        for p, n in zip(prompts, budgets, strict=True)
    ]
    loop = ContinuousBatchLoop(ChunkedTables(slots=2, chunk=CHUNK), k=1)
    stop = [False]
    cancelled = loop.join(row(prompts[2], 30, stop))
    loop.step()
    stop[0] = True
    assert loop.step() == [cancelled] and loop.free_slots == 2  # left while still prefilling
    pending, done, running = list(range(4)), {}, {}
    while pending or loop.rows:
        while pending and loop.free_slots:
            i = pending.pop(0)
            running[loop.join(row(prompts[i], budgets[i]))] = i
        for ended in loop.step():
            done[running.pop(ended)] = ended.result().tokens
    assert [done[i] for i in range(4)] == alone
    assert len(done[2]) == 1  # a budget of one ends with the prompt's last chunk


def llama_target(chunk: int, slots: int = 3) -> TorchBackend:
    return TorchBackend(tiny_llama(3, VOCAB * 4), 128, slots=slots, prompt_chunk=chunk)


@needs_kernel
def test_on_the_row_kernel_chunked_prefill_gives_the_whole_prompts_logits_bit_for_bit():
    prompt = torch.arange(1, 23) % 60
    whole = llama_target(0).prefill_slot(0, prompt)
    chunked = llama_target(5)
    parts = [
        chunked.score_batch([Segment(1, start, prompt[start : start + 5], logits_rows=int(start + 5 >= len(prompt)))])
        for start in range(0, len(prompt), 5)
    ]
    assert [p.shape[0] for p in parts] == [0, 0, 0, 0, 1]
    assert torch.equal(parts[-1][0], whole)


def test_the_head_runs_on_the_returned_rows_only_and_they_equal_a_full_calls():
    target = llama_target(0)
    for slot, prompt in enumerate(([3, 4, 5], [9, 8])):
        target.prefill_slot(slot, torch.tensor(prompt))
    segments = [Segment(0, 3, torch.tensor([6, 7, 8])), Segment(1, 2, torch.tensor([1, 2, 3, 4]))]
    full = target.score_batch(segments)
    target.prefill_slot(0, torch.tensor([3, 4, 5]))
    target.prefill_slot(1, torch.tensor([9, 8]))
    cut = target.score_batch(
        [
            Segment(0, 3, torch.tensor([6, 7, 8]), logits_rows=0),
            Segment(1, 2, torch.tensor([1, 2, 3, 4]), logits_rows=2),
        ]
    )
    assert cut.shape == (2, full.shape[1])
    torch.testing.assert_close(cut, full[5:7], rtol=0, atol=1e-5)


@pytest.mark.parametrize("chunk", [1, 3, 64])
def test_a_llama_batch_with_chunked_prefill_equals_each_request_alone(chunk):
    prompts = [torch.arange(2, 2 + n) % 60 for n in (7, 20, 3, 11)]
    budgets = [10, 6, 12, 8]
    alone = [
        ContinuousBatchLoop(llama_target(0, slots=1), 1).run(RowRequest(p, n, settings=RowSettings(GREEDY))).tokens
        for p, n in zip(prompts, budgets, strict=True)
    ]
    loop = ContinuousBatchLoop(llama_target(chunk, slots=2), 1)
    pending, done, running = list(range(4)), {}, {}
    while pending or loop.rows:
        while pending and loop.free_slots:
            i = pending.pop(0)
            running[loop.join(RowRequest(prompts[i], budgets[i], settings=RowSettings(GREEDY)))] = i
        for ended in loop.step():
            done[running.pop(ended)] = ended.result().tokens
    assert [done[i] for i in range(4)] == alone


def test_the_hugging_face_forward_prefills_whole_prompts():
    assert TorchBackend(tiny_llama(3, VOCAB * 4), 128, forward="hf", prompt_chunk=8).prompt_chunk is None
    assert llama_target(8).prompt_chunk == 8 and llama_target(0).prompt_chunk is None
