"""The drafter interface: one small protocol, many drafters (as in HF's candidate generators).

A drafter sees only the committed tokens and how many it may propose; whatever else it needs (a
draft model, the sampling transform, a random generator) it is given when it is built.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from neuron_ssp.speculation.position_noise import PositionNoise
from neuron_ssp.speculation.sampling import SamplingParams


@dataclass(frozen=True)
class Draft:
    """m proposed tokens and the draft's scores for them; point masses are 0 / -inf logits rows.

    "No draft" is an empty Draft (m = 0), never None.
    """

    tokens: torch.Tensor  # (m,) int64
    logits: torch.Tensor  # (m, V) float32
    # tokens of context the proposal's source matched (prompt lookup's n, the suffix tree's match): evidence
    # for the cost policy; 0 where the drafter does not say (a draft model)
    match_len: int = 0
    # True when the tokens are a function of the context alone (prompt lookup, suffix tree): a policy may
    # then weigh the proposal's length; a sampled draft's length may depend on its own tokens (stop rules)
    deterministic: bool = False
    # leading tokens the row's grammar forces (llguidance's fast-forward tokens): drafts the policy prices as certain,
    # still judged by the target (their KV is needed, and the target may tokenize the forced text otherwise)
    certain: int = 0

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def prefix(self, m: int) -> Draft:
        """The first m proposed tokens (what a window policy keeps of a longer proposal)."""
        if m >= len(self):
            return self
        return Draft(self.tokens[:m], self.logits[:m], self.match_len, self.deterministic, min(self.certain, m))

    def after(self, forced: list[int]) -> Draft:
        """This proposal behind the grammar's forced tokens (point masses, priced as certain)."""
        if not forced:
            return self
        ids = torch.tensor(forced, dtype=torch.long)
        vocab = self.logits.shape[-1]
        return Draft(
            torch.cat([ids, self.tokens]),
            torch.cat([point_masses(ids, vocab), self.logits.to(torch.float32)]),
            self.match_len,
            self.deterministic or not len(self),
            len(forced),
        )

    @classmethod
    def empty(cls, vocab_size: int) -> Draft:
        return cls(torch.empty(0, dtype=torch.long), torch.empty(0, vocab_size))


class Drafter(Protocol):
    def begin(self, prompt_ids: torch.Tensor, max_new_tokens: int, noise: PositionNoise | None = None) -> None:
        """Start a new sequence of at most `max_new_tokens` tokens (a model drafter encodes the prompt,
        after checking that its cache has room for the whole generation). `noise`: the request's noise per
        output position; a drafter that samples draws each token from it, so that the target's draw at the
        same position agrees as often as possible (position_noise.py)."""
        ...

    def propose(self, sequence: torch.Tensor, max_tokens: int) -> Draft:
        """Up to `max_tokens` tokens that may follow `sequence` (all committed tokens, 1-D)."""
        ...

    def finish(self, sequence: torch.Tensor) -> None:
        """The request ended with these committed tokens (prompt + output); a learning drafter keeps them."""
        ...


@runtime_checkable
class ReadsHiddenStates(Protocol):
    """A drafter that drafts from the target's hidden states (an EAGLE-3 head): the loop asks the target for the taps
    of every row it scores for the request (backends.base.HiddenStates) and hands over those of committed tokens."""

    def take_hidden(self, start: int, hidden: torch.Tensor) -> None:
        """The target's taps (n, taps x hidden) at positions start..start+n-1, whose tokens are all committed."""
        ...

    @property
    def fed_positions(self) -> int:
        """Positions of its head's cache that hold committed tokens (what a later request in the slot may reuse)."""
        ...

    def resume_at(self, position: int) -> None:
        """After `begin`: its head's cache of the slot already holds the prompt's positions before `position` (a
        warm slot, engines/slot_caches.py), so the target's taps start there."""
        ...


# (V,) draft logits of the token after the committed tokens and `drafted` (this proposal's tokens so far) -> the
# logits the row's processors leave (its grammar's mask, its controls): a sampled draft is drafted under the mask
DraftMask = Callable[[torch.Tensor, list[int]], torch.Tensor]


@runtime_checkable
class SamplesDrafts(Protocol):
    """A drafter that draws its tokens from a distribution (a draft model, an EAGLE head): the loop hands it the
    row's processors for this proposal (`mask`, None when the row has none) before it proposes."""

    mask: DraftMask | None


@runtime_checkable
class PerRow(Protocol):
    """A drafter with state per request (a draft model's or a head's cache slot, a suffix tree over the request):
    the pipeline's loaded one makes each row's over the same models and shared history."""

    def for_row(self, slot: int, sampling: SamplingParams, rng: torch.Generator | None) -> Drafter:
        """The drafter of a row in cache slot `slot`, drawing with the request's `sampling` (and `rng` where it
        does not use the per-position noise)."""
        ...


DraftRequest = tuple[Drafter, torch.Tensor, int]  # a row's drafter, its committed tokens, the most to draft


@runtime_checkable
class LockStep(Protocol):
    """A drafter whose rows draft together: one draft call per drafted position for all rows of a batch."""

    @staticmethod
    def propose_together(requests: Sequence[DraftRequest]) -> list[Draft]:
        """Each request's draft, as `propose` would give it."""
        ...


def point_masses(tokens: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Logits whose softmax is a one-hot on each token: how a model-free drafter states certainty."""
    logits = torch.full((tokens.shape[0], vocab_size), float("-inf"))
    logits[torch.arange(tokens.shape[0]), tokens] = 0.0
    return logits
