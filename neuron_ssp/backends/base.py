"""The one interface the generator needs from a model, whatever runs it (torch or Neuron).

Batch size is 1: speculation on Neuron requires it, and it keeps the loop plain.
Positions are absolute KV-cache slots. `score(ids, start)` writes slots start..start+n-1 and makes
every slot >= start that held something else stale (Neuron overwrites by `cache_ids`; the torch
backend crops its cache), which is how a rejected draft is rolled back.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class ModelBackend(Protocol):
    name: str
    vocab_size: int
    n_positions: int  # cache slots available: prompt + generated + k must fit
    max_score_width: int | None  # widest window scored in ONE call (Neuron: compiled k); None = any

    def prefill(self, prompt_ids: torch.Tensor) -> torch.Tensor:
        """Encode the prompt (1-D int64) into slots 0..len-1; return the next-token logits, shape (vocab,)."""
        ...

    def score(self, token_ids: torch.Tensor, start: int) -> torch.Tensor:
        """Score 1-D int64 `token_ids` at slots start..start+n-1; return float32 logits, shape (n, vocab)."""
        ...
