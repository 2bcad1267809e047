"""A draft language model on any backend, drafting one token per call.

It remembers which tokens its KV cache holds; before drafting it feeds only the committed tokens it
has not seen (the target's token, and the last draft token when the whole draft was accepted).
Draft tokens are drawn with the same sampling transform as the target's, which keeps the acceptor's q
the distribution the tokens really came from; given the request's per-position noise (our loop gives
it), from the same uniform the target's draw at that position uses (position_noise.py), else from the
random generator.
"""

from __future__ import annotations

import torch

from neuron_ssp.backends.base import ModelBackend
from neuron_ssp.drafters.base import Draft
from neuron_ssp.errors import Problem, RuntimeProblem
from neuron_ssp.speculation.position_noise import PositionNoise, draw
from neuron_ssp.speculation.sampling import SamplingParams, first_non_finite_row, next_token
from neuron_ssp.topology.positions import draft_slots, require_room


class ModelDrafter:
    def __init__(self, backend: ModelBackend, sampling: SamplingParams, generator: torch.Generator | None,
                 stop_below: float = 0.0):
        """`stop_below`: the draft-confidence rule, stop drafting when the draft's top probability
        (temperature 1) falls below it; 0 never stops early."""
        self.backend = backend
        self.vocab_size = backend.vocab_size
        self.sampling = sampling
        self.generator = generator
        self.stop_below = stop_below
        self._cached: list[int] = []  # token in each KV slot the draft backend has filled
        self._noise: PositionNoise | None = None
        self._prompt_len = 0

    def begin(self, prompt_ids: torch.Tensor, max_new_tokens: int, noise: PositionNoise | None = None) -> None:
        prompt_len = prompt_ids.shape[0]
        require_room(self.backend.n_positions, draft_slots(prompt_len, max_new_tokens), prompt_len,
                     max_new_tokens, "draft.n_positions")
        self.backend.prefill(prompt_ids)
        self._cached = prompt_ids.tolist()
        self._noise, self._prompt_len = noise, prompt_len

    def propose(self, sequence: torch.Tensor, max_tokens: int) -> Draft:
        committed = sequence.tolist()
        valid = self._valid_prefix(committed)
        logits = self._checked(self.backend.score(sequence[valid:], valid)[-1], len(committed) - 1)
        self._cached = committed
        tokens: list[int] = []
        rows: list[torch.Tensor] = []
        for step in range(max_tokens):
            if self.stop_below and float(logits.float().softmax(-1).max()) < self.stop_below:
                break
            token = self._draw(logits, len(committed) + step)
            tokens.append(token)
            rows.append(logits)
            if step + 1 < max_tokens:
                position = len(self._cached)
                logits = self._checked(self.backend.score(torch.tensor([token]), position)[-1], position)
                self._cached.append(token)
        if not tokens:
            return Draft.empty(self.vocab_size)
        return Draft(torch.tensor(tokens), torch.stack(rows).float())

    def finish(self, sequence: torch.Tensor) -> None:
        """A draft model learns nothing across requests."""

    def _draw(self, logits: torch.Tensor, position: int) -> int:
        if self._noise is None:
            return next_token(logits, self.sampling, self.generator)
        return draw(logits, self.sampling, self._noise.shifted(position - self._prompt_len))

    def _valid_prefix(self, committed: list[int]) -> int:
        """Slots whose cached token still equals the committed one; only the tail can differ."""
        valid = min(len(self._cached), len(committed) - 1)  # always re-feed at least the last token
        while valid > 0 and self._cached[valid - 1] != committed[valid - 1]:
            valid -= 1
        return valid

    def _checked(self, logits: torch.Tensor, position: int) -> torch.Tensor:
        if first_non_finite_row(logits.view(1, -1)) is not None:
            raise RuntimeProblem(Problem(
                "draft.path", self.backend.name,
                f"the draft model produced non-finite logits (NaN or inf) at position {position}",
                "check the draft's weights and dtype (fp16 overflows are common: try bf16 or fp32)"))
        return logits
