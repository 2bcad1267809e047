"""The drafter interface: one small protocol, many drafters (as in HF's candidate generators)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from neuron_ssp.policies import FixedPolicy
from neuron_ssp.sampling import SamplingParams


@dataclass(frozen=True)
class Draft:
    """m proposed tokens and the draft's scores for them; point masses are 0 / -inf logits rows."""

    tokens: torch.Tensor  # (m,) int64
    logits: torch.Tensor  # (m, V) float32

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


class Drafter(Protocol):
    def begin(self, prompt_ids: torch.Tensor) -> None:
        """Start a new sequence (a model drafter encodes the prompt here)."""
        ...

    def propose(self, sequence: torch.Tensor, max_tokens: int, policy: FixedPolicy,
                sampling: SamplingParams, generator: torch.Generator | None) -> Draft:
        """Up to `max_tokens` tokens that may follow `sequence` (all committed tokens, 1-D)."""
        ...

    def finish(self, sequence: torch.Tensor) -> None:
        """The request ended with these committed tokens (prompt + output); a learning drafter keeps them."""
        ...


def point_masses(tokens: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Logits whose softmax is a one-hot on each token: how a model-free drafter states certainty."""
    logits = torch.full((tokens.shape[0], vocab_size), float("-inf"))
    logits[torch.arange(tokens.shape[0]), tokens] = 0.0
    return logits
