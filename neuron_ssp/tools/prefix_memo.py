"""A backend wrapper that computes each token prefix's logits once and remembers them.

The model is a deterministic function of the token prefix, so drawing thousands of samples of the first
new tokens needs only one forward pass per distinct prefix; the sampler under test (drafter, acceptor,
generator loop) still runs in full for every sample. It keeps the ModelBackend contract.
"""

from __future__ import annotations

import torch

from neuron_ssp.backends.base import ModelBackend, SingleSlot


class PrefixMemo(SingleSlot):
    def __init__(self, inner: ModelBackend):
        self.inner = inner
        self.name = f"memo({inner.name})"
        self.vocab_size = inner.vocab_size
        self.n_positions = inner.n_positions
        self.max_score_width = inner.max_score_width
        self.forward_passes = 0
        self._rows: dict[tuple[int, ...], torch.Tensor] = {}
        self._slots: list[int] = []  # the sequence the caller is scoring
        self._inner_slots: list[int] = []  # what the inner backend's cache holds

    def prefill(self, prompt_ids: torch.Tensor) -> torch.Tensor:
        self._slots = prompt_ids.tolist()
        key = tuple(self._slots)
        if key not in self._rows:
            self._rows[key] = self.inner.prefill(prompt_ids)
            self._inner_slots = list(self._slots)
            self.forward_passes += 1
        return self._rows[key]

    def score(self, token_ids: torch.Tensor, start: int) -> torch.Tensor:
        self._slots = self._slots[:start] + token_ids.tolist()
        keys = [tuple(self._slots[: start + i + 1]) for i in range(token_ids.shape[0])]
        if any(key not in self._rows for key in keys):
            prefix = self._slots[:start]
            if self._inner_slots[:start] != prefix:  # the inner cache must hold this prefix first
                self.inner.prefill(torch.tensor(prefix))
                self.forward_passes += 1
            logits = self.inner.score(token_ids, start)
            self._inner_slots = list(self._slots)
            self.forward_passes += 1
            for key, row in zip(keys, logits, strict=True):
                self._rows.setdefault(key, row)  # the first value seen stays: every read agrees
        return torch.stack([self._rows[key] for key in keys])
