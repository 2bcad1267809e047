"""A draft language model on any backend, drafting one token per call, for all rows of a batch at once.

It remembers which tokens its KV cache holds; before drafting it feeds only the committed tokens it
has not seen (the target's token, and the last draft token when the whole draft was accepted).
Draft tokens are drawn with the same sampling transform as the target's, which keeps the acceptor's q
the distribution the tokens really came from; given the request's per-position noise (our loop gives
it), from the same uniform the target's draw at that position uses (position_noise.py), else from the
random generator.

Rows of a batch whose drafters are slots of one batched draft backend (SlotView) draft in lock-step: one
draft call per drafted position scores every row still drafting (`propose_together`), not one call per
row per position. On compiled shapes (Neuron), where a call costs the whole batch's rows anyway, that is
the difference between k-1 and B x (k-1) draft calls a step.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from neuron_ssp.backends.base import ModelBackend, Segment, SlotView
from neuron_ssp.drafters.base import Draft, DraftMask
from neuron_ssp.errors import Problem, RuntimeProblem
from neuron_ssp.speculation.position_noise import PositionNoise, draw
from neuron_ssp.speculation.sampling import SamplingParams, first_non_finite_row, next_token
from neuron_ssp.topology.positions import draft_slots, require_room


class ModelDrafter:
    def __init__(
        self,
        backend: ModelBackend,
        sampling: SamplingParams,
        generator: torch.Generator | None,
        stop_below: float = 0.0,
    ):
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
        self.mask: DraftMask | None = None  # the row's processors, set by the loop before each proposal

    def begin(self, prompt_ids: torch.Tensor, max_new_tokens: int, noise: PositionNoise | None = None) -> None:
        prompt_len = prompt_ids.shape[0]
        require_room(
            self.backend.n_positions,
            draft_slots(prompt_len, max_new_tokens),
            prompt_len,
            max_new_tokens,
            "draft.n_positions",
        )
        self.backend.prefill(prompt_ids)
        self._cached = prompt_ids.tolist()
        self._noise, self._prompt_len = noise, prompt_len

    def propose(self, sequence: torch.Tensor, max_tokens: int) -> Draft:
        return propose_together([(self, sequence, max_tokens)])[0]

    def for_row(self, slot: int, sampling: SamplingParams, rng: torch.Generator | None) -> ModelDrafter:
        """The draft model's cache slot of the row."""
        return ModelDrafter(SlotView(self.backend, slot), sampling, rng, self.stop_below)

    def finish(self, sequence: torch.Tensor) -> None:
        """A draft model learns nothing across requests; the row's slot of a batched draft backend is released."""
        if isinstance(self.backend, SlotView):
            self.backend.release()

    @staticmethod
    def propose_together(requests: Sequence[DraftRequest]) -> list[Draft]:
        """Several rows' drafts in lock-step (module-level `propose_together`): base.LockStep."""
        return propose_together(requests)

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
            raise RuntimeProblem(
                Problem(
                    "draft.path",
                    self.backend.name,
                    f"the draft model produced non-finite logits (NaN or inf) at position {position}",
                    "check the draft's weights and dtype (fp16 overflows are common: try bf16 or fp32)",
                )
            )
        return logits


DraftRequest = tuple[ModelDrafter, torch.Tensor, int]  # a row's drafter, its committed tokens, the most to draft


class _Drafting:
    """One row's draft in progress: what its draft model scores next (None: done), and what it drew."""

    def __init__(self, drafter: ModelDrafter, sequence: torch.Tensor, max_tokens: int):
        committed = sequence.tolist()
        valid = drafter._valid_prefix(committed)
        drafter._cached = committed
        backend = drafter.backend
        self.slot = backend.slot if isinstance(backend, SlotView) else 0
        self.drafter, self.max_tokens, self.output_start = drafter, max_tokens, len(committed)
        self.position = len(committed) - 1  # of the token whose logits come back next
        self.next: Segment | None = Segment(self.slot, valid, sequence[valid:])
        self.tokens: list[int] = []
        self.rows: list[torch.Tensor] = []

    def take(self, logits: torch.Tensor) -> None:
        """The logits after the last scored token: draw the next draft token, or stop."""
        drafter = self.drafter
        logits = drafter._checked(logits, self.position)
        self.next = None
        if (
            len(self.tokens) == self.max_tokens
            or drafter.stop_below
            and float(logits.float().softmax(-1).max()) < drafter.stop_below
        ):
            return
        if drafter.mask is not None:  # drafted under the row's grammar and controls, so q is what was drawn from
            logits = drafter.mask(logits, self.tokens)
        token = drafter._draw(logits, self.output_start + len(self.tokens))
        self.tokens.append(token)
        self.rows.append(logits)
        if len(self.tokens) < self.max_tokens:
            self.position = len(drafter._cached)
            self.next = Segment(self.slot, self.position, torch.tensor([token]))
            drafter._cached.append(token)

    def draft(self) -> Draft:
        if not self.tokens:
            return Draft.empty(self.drafter.vocab_size)
        return Draft(torch.tensor(self.tokens), torch.stack(self.rows).float())


def propose_together(requests: Sequence[DraftRequest]) -> list[Draft]:
    """Each row's draft (as `ModelDrafter.propose`). Rows on slots of one batched backend share each draft call;
    others draft one after another. A row's logits do not depend on the rows beside it (backends.base), so
    neither do its tokens."""
    rows = [_Drafting(*request) for request in requests]
    shared = _one_batched_backend([row.drafter.backend for row in rows])
    for group in [rows] if shared is not None else [[row] for row in rows]:
        while live := [row for row in group if row.next is not None]:
            if shared is None:
                segment = live[0].next
                assert segment is not None
                live[0].take(live[0].drafter.backend.score(segment.tokens, segment.start)[-1])
            else:
                segments = [row.next for row in live if row.next is not None]
                logits = shared.score_batch(segments).split([len(segment.tokens) for segment in segments])
                for row, row_logits in zip(live, logits, strict=True):
                    row.take(row_logits[-1])
    return [row.draft() for row in rows]


def _one_batched_backend(backends: list[ModelBackend]) -> ModelBackend | None:
    """The batched backend every row drafts on (each through its slot's view), or None."""
    owners = {id(view.backend): view.backend for view in backends if isinstance(view, SlotView)}
    if len(owners) != 1 or not all(isinstance(view, SlotView) for view in backends):
        return None
    return next(iter(owners.values()))
