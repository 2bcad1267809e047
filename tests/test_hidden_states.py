"""Backends hand out hidden states (issue 42 item 1): the taps of the rows a segment asks for equal Hugging Face's
output_hidden_states[layer] (the residual stream entering that layer), on the row kernel, the torch path and
Hugging Face's forward; callers that never ask receive what they always did, and nothing is gathered for them."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_llama
from test_batched_scoring import needs_kernel

from neuron_ssp.backends.base import HiddenStates, Segment
from neuron_ssp.backends.torch.scoring import TorchBackend

TAPS = (2, 0, 3)  # not sorted: the order asked is the order returned
PROMPT = torch.tensor([1, 5, 7, 9, 5, 7, 11, 3, 2, 8])
LONG = torch.arange(70) % 97  # past MAX_ROWS (64): the kernel path cuts the call in two


def reference(model, tokens: torch.Tensor) -> torch.Tensor:
    """Hugging Face's own hidden states of a whole sequence at the tap layers, side by side."""
    with torch.no_grad():
        out = model(input_ids=tokens.view(1, -1), output_hidden_states=True)
    return torch.cat([out.hidden_states[layer][0] for layer in TAPS], -1)


FORWARDS = [
    pytest.param("compact", True, marks=needs_kernel, id="row-kernel"),
    pytest.param("compact", False, id="torch-path"),
    pytest.param("hf", None, id="hf"),
]


def tapped_backend(forward: str, pack: bool | None, slots: int = 2) -> tuple[object, TorchBackend]:
    model = tiny_llama(4, layers=4)
    backend = TorchBackend(model, 128, forward=forward, pack=pack, slots=slots)
    backend.set_taps(TAPS)
    return model, backend


@pytest.mark.parametrize(("forward", "pack"), FORWARDS)
def test_prefill_and_windows_return_the_taps_of_the_rows_asked(forward, pack):
    model, backend = tapped_backend(forward, pack)
    assert isinstance(backend, HiddenStates)
    whole = torch.cat([PROMPT, torch.tensor([4, 6, 8, 10, 12])])
    expected = reference(model, whole)
    logits, taps = backend.prefill_slot_hidden(1, PROMPT)
    torch.testing.assert_close(taps, expected[: len(PROMPT)], atol=1e-5, rtol=1e-5)
    assert logits.shape == (97,)
    backend.prefill_slot(0, PROMPT[:3])
    segments = [Segment(0, 3, PROMPT[3:5], hidden_rows=0), Segment(1, len(PROMPT), whole[len(PROMPT) :], hidden_rows=3)]
    logits, taps = backend.score_batch_hidden(segments)
    assert logits.shape == (7, 97)
    torch.testing.assert_close(taps, expected[-3:], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("forward", "pack"), FORWARDS)
def test_a_prompt_chunk_past_max_rows_returns_every_row(forward, pack):
    model, backend = tapped_backend(forward, pack, slots=1)
    if forward == "hf":
        backend.prefill_slot(0, LONG[:1])
    logits, taps = backend.score_batch_hidden([Segment(0, 0, LONG, logits_rows=1, hidden_rows=len(LONG))])
    torch.testing.assert_close(taps, reference(model, LONG), atol=1e-5, rtol=1e-5)
    assert logits.shape == (1, 97)


@pytest.mark.parametrize(("forward", "pack"), FORWARDS)
def test_callers_that_never_ask_get_the_same_logits_and_nothing_is_gathered(forward, pack):
    model, plain = tapped_backend(forward, pack)
    asked = TorchBackend(model, 128, forward=forward, pack=pack, slots=2)
    asked.set_taps(TAPS)
    calls = []
    original = type(plain._forward)._forward if forward == "compact" else None
    if original is not None:
        plain._forward._run = lambda *args: (
            calls.append(args[3] if len(args) > 3 else None) or original(plain._forward, *args)
        )
    torch.testing.assert_close(plain.prefill_slot(0, PROMPT), asked.prefill_slot_hidden(0, PROMPT)[0])
    window = torch.tensor([4, 6, 8])
    torch.testing.assert_close(
        plain.score_batch([Segment(0, len(PROMPT), window)]),
        asked.score_batch_hidden([Segment(0, len(PROMPT), window, hidden_rows=3)])[0],
    )
    logits, taps = plain.score_batch_hidden([Segment(0, len(PROMPT), window)])
    assert taps.shape == (0, 3 * 32)
    if original is not None:
        assert calls == [None, None, None]  # no row indices: the forward copies nothing


def test_tap_layers_outside_the_model_are_refused():
    backend = TorchBackend(tiny_llama(0), 64)
    with pytest.raises(ValueError, match=r"tap layers \[0, 2\]: torch has layers 0..1"):
        backend.set_taps([0, 2])
    with pytest.raises(RuntimeError, match="set_taps before"):
        backend.score_batch_hidden([Segment(0, 0, PROMPT, hidden_rows=1)])
