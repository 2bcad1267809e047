"""Backends that hold several sequences: `score_batch` scores segments of many slots in one call. On the row
kernel each row's logits are bit-identical to scoring its segment alone (in another backend holding only that
sequence), whatever the mix, the rollbacks and the chunking past MAX_ROWS; on the torch path and Hugging Face's
forward they match within fp32 tolerance. Batch-1 backends (Neuron) refuse anything but slot 0."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
from conftest import TableBackend, tiny_llama
from test_compact_forward import rope_llama

from neuron_ssp.backends.base import Segment, SingleSlot, SlotView
from neuron_ssp.backends.neuron.scoring import NeuronBackend
from neuron_ssp.backends.nxdi.scoring import NxdiBackend
from neuron_ssp.backends.torch import load as torch_load
from neuron_ssp.backends.torch import row_kernel as kernel_module
from neuron_ssp.backends.torch.llama_forward import row_chunks
from neuron_ssp.backends.torch.scoring import TorchBackend, kv_cache_bytes
from neuron_ssp.errors import UsageError

SLOTS = 4
PROMPTS = [
    torch.tensor([1, 5, 7, 9, 5, 7, 11]),
    torch.tensor([3, 2, 8]),
    torch.tensor([40, 41, 42, 43, 44, 45]),
    torch.tensor([9]),
]
needs_kernel = pytest.mark.skipif(
    kernel_module.row_kernel() is None, reason=f"row kernel not built: {kernel_module.unavailable_reason()}"
)


def tokens(seed: int, count: int) -> torch.Tensor:
    return torch.randint(0, 97, (count,), generator=torch.Generator().manual_seed(seed))


def mixes() -> list[list[tuple[int, int, int]]]:
    """Calls of (slot, start, rows), in the order they run: every slot decoding one token, windows of several
    widths, slots in any order or left out, rollbacks (a start before the slot's last end: those positions are
    overwritten), and 80 rows (two chunks, the last segment cut between them)."""
    return [
        [(0, 7, 1), (1, 3, 1), (2, 6, 1), (3, 1, 1)],
        [(0, 8, 3), (1, 4, 1), (2, 7, 5), (3, 2, 2)],
        [(3, 3, 4), (0, 9, 2)],  # slot 0 rolls back 2 of its 3, slot 3 one of its 2; 1 and 2 sit out
        [(2, 10, 1), (1, 5, 6), (0, 11, 1)],
        [(1, 11, 20), (0, 12, 20), (3, 7, 20), (2, 11, 20)],
        [(2, 25, 3), (0, 30, 1)],
    ]  # rolls back into the positions the second chunk wrote


@contextmanager
def threads(count: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def run_mixes(
    batched: TorchBackend, alone: list[TorchBackend], batched_threads: int = 1
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(batched logits, the same rows scored segment by segment in one backend per slot, on one thread) for every
    prefill and every call."""
    pairs = [(batched.prefill_slot(slot, prompt), alone[slot].prefill(prompt)) for slot, prompt in enumerate(PROMPTS)]
    for call, mix in enumerate(mixes()):
        segments = [Segment(slot, start, tokens(10 * call + slot, rows)) for slot, start, rows in mix]
        with threads(batched_threads):
            together = batched.score_batch(segments)
        separate = torch.cat([alone[s.slot].score(s.tokens, s.start) for s in segments])
        assert together.shape == (sum(rows for *_, rows in mix), batched.vocab_size)
        pairs.append((together, separate))
    return pairs


@needs_kernel
@pytest.mark.parametrize("model", [tiny_llama(0), rope_llama(None)], ids=["mha", "gqa-head_dim-16"])
@pytest.mark.parametrize("batched_threads", [1, 3])  # 3: attention tasks (segment, kv head) spread over threads
def test_row_kernel_rows_are_bit_identical_to_their_segment_alone(model, batched_threads):
    batched = TorchBackend(model, 128, pack=True, slots=SLOTS)
    assert batched._forward.w.layout == "row kernel"
    alone = [TorchBackend(model, 128, pack=True) for _ in PROMPTS]
    for together, separate in run_mixes(batched, alone, batched_threads):
        assert torch.equal(together, separate)


@needs_kernel
def test_the_row_kernel_matches_hugging_face_in_every_slot():
    model = tiny_llama(0)
    batched = TorchBackend(model, 128, pack=True, slots=SLOTS)
    for together, separate in run_mixes(batched, [TorchBackend(model, 128, forward="hf") for _ in PROMPTS]):
        torch.testing.assert_close(together, separate, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("forward", ["compact", "hf"])
def test_the_torch_path_and_hugging_faces_forward_match_their_segments_alone(forward):
    """Without the kernel the linear layers run over all rows at once: torch's GEMMs may round differently for
    another row count, so within tolerance; Hugging Face's forward scores segment by segment."""
    model = tiny_llama(1)
    batched = TorchBackend(model, 128, forward=forward, pack=False, slots=SLOTS)
    assert batched.forward_name == forward and batched.slots == SLOTS
    for together, separate in run_mixes(
        batched, [TorchBackend(model, 128, forward=forward, pack=False) for _ in PROMPTS]
    ):
        torch.testing.assert_close(together, separate, atol=1e-5, rtol=1e-5)


def test_calls_are_cut_at_max_rows_and_a_cut_segment_goes_on_where_it_stopped():
    assert row_chunks([(0, 7, 3), (1, 0, 5), (2, 4, 2)], 4) == [((0, 7, 3), (1, 0, 1)), ((1, 1, 4),), ((2, 4, 2),)]
    assert row_chunks([(1, 9, 64)], 64) == [((1, 9, 64),)]


@pytest.mark.parametrize("forward", ["compact", "hf"])
def test_a_call_naming_a_slot_twice_or_one_the_cache_lacks_is_refused(forward):
    backend = TorchBackend(tiny_llama(0), 64, forward=forward, slots=2)
    backend.prefill_slot(1, PROMPTS[0])
    one = torch.tensor([4])
    with pytest.raises(ValueError, match="each slot at most once"):
        backend.score_batch([Segment(1, 7, one), Segment(1, 8, one)])
    with pytest.raises(ValueError, match=r"slots \[2\]: the cache holds slots 0..1"):
        backend.score_batch([Segment(2, 0, one)])
    with pytest.raises(ValueError, match="slots"):
        backend.prefill_slot(-1, PROMPTS[0])
    with pytest.raises(ValueError, match="at least one segment"):
        backend.score_batch([])


def test_prefill_and_score_are_slot_0s():
    model = tiny_llama(2)
    batched, alone = TorchBackend(model, 64, slots=2), TorchBackend(model, 64)
    batched.prefill_slot(1, PROMPTS[1])
    assert torch.equal(batched.prefill(PROMPTS[0]), alone.prefill(PROMPTS[0]))
    assert torch.equal(batched.score(torch.tensor([4, 8]), 7), alone.score(torch.tensor([4, 8]), 7))


def test_a_slot_view_is_a_one_sequence_backend_on_its_slot():
    model = tiny_llama(2)
    batched, alone = TorchBackend(model, 64, slots=3), TorchBackend(model, 64)
    view = SlotView(batched, 2)
    assert (view.slots, view.name, view.vocab_size, view.n_positions, view.max_score_width, view.device) == (
        1,
        batched.name,
        batched.vocab_size,
        batched.n_positions,
        None,
        batched.device,
    )
    assert torch.equal(view.prefill(PROMPTS[2]), alone.prefill(PROMPTS[2]))
    assert torch.equal(view.score_batch([Segment(0, 6, torch.tensor([5, 6]))]), alone.score(torch.tensor([5, 6]), 6))
    assert torch.equal(view.score(torch.tensor([7]), 7), batched.score_batch([Segment(2, 7, torch.tensor([7]))]))
    with pytest.raises(ValueError, match="this backend holds one sequence"):
        view.prefill_slot(1, PROMPTS[0])


def test_batch_1_backends_take_slot_0_alone_and_say_batch_1_is_all_neuron_has():
    assert issubclass(NeuronBackend, SingleSlot) and issubclass(NxdiBackend, SingleSlot)
    backend, reference = TableBackend(97, 0), TableBackend(97, 0)
    assert backend.slots == 1
    assert torch.equal(backend.prefill_slot(0, PROMPTS[0]), reference.prefill(PROMPTS[0]))
    window = torch.tensor([4, 8, 15])
    assert torch.equal(backend.score_batch([Segment(0, 7, window)]), reference.score(window, 7))
    for segments in ([Segment(1, 7, window)], [Segment(0, 7, window), Segment(0, 9, window)], []):
        with pytest.raises(ValueError, match="this backend holds one sequence"):
            backend.score_batch(segments)
    with pytest.raises(ValueError, match="this backend holds one sequence"):
        backend.prefill_slot(1, PROMPTS[0])


@pytest.mark.parametrize("pack", [True, False])
def test_kv_cache_bytes_is_what_the_compact_forward_allocates(pack):
    model = rope_llama(None)
    forward = TorchBackend(model, 100, pack=pack, slots=3)._forward
    allocated = sum(t.untyped_storage().nbytes() for t in (forward.keys, forward.values))
    assert allocated <= kv_cache_bytes(model, 3, 100) <= allocated + 2 * 3 * 16 * 16 * 4  # kernel's key padding
    assert kv_cache_bytes(model, 3, 10_000) == kv_cache_bytes(model, 3, 512)  # capped like the backend


def test_the_loader_refuses_caches_larger_than_the_free_memory(monkeypatch):
    model = tiny_llama(0)
    needed = 2 * kv_cache_bytes(model, 8, 64)  # target and draft
    monkeypatch.setattr(torch_load, "host_memory_available", lambda: needed - 1)
    with pytest.raises(UsageError) as err:
        torch_load.check_caches_fit([(model, 64), (model, 64)], 8, torch.device("cpu"))
    problem = err.value.problems[0]
    assert problem.field == "serve.max_batch" and problem.value == 8 and "lower serve.max_batch" in problem.fix
    monkeypatch.setattr(torch_load, "host_memory_available", lambda: needed)
    torch_load.check_caches_fit([(model, 64), (model, 64)], 8, torch.device("cpu"))
    monkeypatch.setattr(torch_load, "host_memory_available", lambda: None)  # unreadable: not checked
    torch_load.check_caches_fit([(model, 64)], 10**6, torch.device("cpu"))
