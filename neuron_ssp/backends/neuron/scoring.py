"""`ModelBackend` over a transformers-neuronx `LlamaForSampling` (batch 1, position-addressed KV cache).

The compiled networks fix the shapes: context encoding (`forward` with `cache_ids=None`, logits of the
LAST position only), one-token decoding (`forward` at one cache id), and on a speculation-enabled
target one k-token window per compiled k (`speculative_forward(..., speculation_length=k)` picks it,
logits `(k, vocab, batch)`). A shorter window is padded to k: the padded slots get junk, which is
harmless because every slot >= start is stale by contract and rewritten before it is read.
`with_window(k)` gives a backend on the same loaded model scoring with another compiled k (tune-k).
A model compiled for batch > 1 is scored by `batched.BatchedNeuronBackend`, this class's batched form.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from neuron_ssp.backends.base import SingleSlot, check_compiled_room
from neuron_ssp.errors import Problem, UsageError


class NeuronBackend(SingleSlot):
    """Scores through the networks compiled into one Neuron model; knows nothing of acceptance."""

    def __init__(
        self,
        model: Any,
        name: str,
        vocab_size: int,
        n_positions: int,
        speculation_length: int | None,
        compiled_windows: list[int] | None = None,
    ):
        self.model = model
        self.name = name
        self.vocab_size = vocab_size
        self.n_positions = n_positions
        self.speculation_length = speculation_length
        self.compiled_windows = sorted(compiled_windows or ([speculation_length] if speculation_length else []))
        self.max_score_width: int | None = speculation_length or 1

    def with_window(self, k: int) -> NeuronBackend:
        """The same loaded model scoring k-wide windows; k must be one the model was compiled for."""
        if k not in self.compiled_windows:
            raise UsageError(
                Problem(
                    "speculation.k",
                    k,
                    f"the {self.name} holds scoring networks for k in {self.compiled_windows} only",
                    f"compile every k you want to use at once: neuron-ssp compile CONFIG --k "
                    f"{','.join(str(n) for n in sorted({*self.compiled_windows, k}))}",
                )
            )
        window = copy.copy(self)  # the same model (and, batched, the same record of its cache)
        window.speculation_length = window.max_score_width = k
        return window

    @torch.inference_mode()
    def prefill(self, prompt_ids: torch.Tensor) -> torch.Tensor:
        self._check_room(0, prompt_ids.shape[0])
        logits = self.model.forward(prompt_ids.view(1, -1), cache_ids=None)  # context encoding, slots 0..n-1
        return logits[0, : self.vocab_size].float()

    @torch.inference_mode()
    def score(self, token_ids: torch.Tensor, start: int) -> torch.Tensor:
        n = token_ids.shape[0]
        self._check_room(start, n)
        k = self.speculation_length
        rows: list[torch.Tensor] = []
        offset = 0
        while offset < n:
            width = min(k, n - offset) if k else 1
            chunk = token_ids[offset : offset + width]
            position = start + offset
            if width == 1 or position + k > self.n_positions:  # no room to pad: decode token by token
                rows += [self._decode_one(chunk[i : i + 1], position + i) for i in range(width)]
            else:
                rows.append(self._score_window(chunk, position, k))
            offset += width
        return torch.cat(rows)

    def _decode_one(self, token: torch.Tensor, position: int) -> torch.Tensor:
        logits = self.model.forward(token.view(1, 1), cache_ids=torch.tensor([position], dtype=torch.int32))
        return logits[:, : self.vocab_size].float()

    def _score_window(self, tokens: torch.Tensor, start: int, k: int) -> torch.Tensor:
        n = tokens.shape[0]
        padded = torch.cat([tokens, tokens[-1:].expand(k - n)])  # repeat the last token into the junk slots
        cache_ids = torch.arange(start, start + k, dtype=torch.int32)
        logits = self.model.speculative_forward(padded.view(1, k), cache_ids=cache_ids, speculation_length=k)
        return logits[:n, : self.vocab_size, 0].float()  # (k, vocab, batch) -> the n real rows

    def _check_room(self, start: int, n: int) -> None:
        check_compiled_room(self.name, self.n_positions, start, n)
