"""A draft language model on any backend, drafting one token per call.

It remembers which tokens its KV cache holds; before drafting it feeds only the committed tokens it
has not seen (the target's token, and the last draft token when the whole draft was accepted).
"""

from __future__ import annotations

import torch

from neuron_ssp.backends.base import ModelBackend
from neuron_ssp.drafters.base import Draft
from neuron_ssp.policies import FixedPolicy
from neuron_ssp.sampling import SamplingParams, logits_to_probs, sample


class ModelDrafter:
    def __init__(self, backend: ModelBackend):
        self.backend = backend
        self.vocab_size = backend.vocab_size
        self._cached: list[int] = []  # token in each KV slot the draft backend has filled

    def begin(self, prompt_ids: torch.Tensor) -> None:
        self.backend.prefill(prompt_ids)
        self._cached = prompt_ids.tolist()

    def propose(self, sequence: torch.Tensor, max_tokens: int, policy: FixedPolicy,
                sampling: SamplingParams, generator: torch.Generator | None) -> Draft:
        committed = sequence.tolist()
        valid = self._valid_prefix(committed)
        logits = self.backend.score(sequence[valid:], valid)[-1]
        self._cached = committed
        tokens: list[int] = []
        rows: list[torch.Tensor] = []
        for step in range(max_tokens):
            if policy.uses_draft_confidence and not policy.keep_drafting(float(logits.softmax(-1).max())):
                break
            token = int(sample(logits_to_probs(logits, sampling), generator)) if not sampling.greedy \
                else int(logits.argmax())
            tokens.append(token)
            rows.append(logits)
            if step + 1 < max_tokens:
                logits = self.backend.score(torch.tensor([token]), len(self._cached))[-1]
                self._cached.append(token)
        if not tokens:
            return Draft(torch.empty(0, dtype=torch.long), torch.empty(0, self.vocab_size))
        return Draft(torch.tensor(tokens), torch.stack(rows))

    def finish(self, sequence: torch.Tensor) -> None:
        """A draft model learns nothing across requests."""

    def _valid_prefix(self, committed: list[int]) -> int:
        """Slots whose cached token still equals the committed one; only the tail can differ."""
        valid = min(len(self._cached), len(committed) - 1)  # always re-feed at least the last token
        while valid > 0 and self._cached[valid - 1] != committed[valid - 1]:
            valid -= 1
        return valid
