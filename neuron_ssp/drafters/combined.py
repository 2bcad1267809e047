"""ngram+eagle3: prompt lookup where its match is long, the EAGLE-3 head otherwise, chosen per step by expected goodput.

Each step, per row, prompt lookup proposes first (microseconds). Then the expected committed tokens per millisecond
of each choice are compared (TurboSpec's goodput, as cost_policy.py): keeping w-1 drafted tokens commits on average
E(w) = 1 + sum_{i<w} prod_{j<=i} p_j and costs the target call t(w) (call_cost.WidthCost, timed at load) plus, for the
head, w-1 head calls (`head_ms` each, timed at load: the lookup's cost is taken as 0). p_j comes from one
cost_policy.AcceptanceModel per source: the lookup's cells know its match length, the head's are the match-unknown
ones; both learn from every outcome (a drafted token is accepted exactly when it is the token the row then commits
at its position: greedy, and coupled sampling, position_noise.py). The drafter sees no target confidence, so its
cells take the middle class. The head drafts only the best w-1 tokens for it, saving the calls past them.

The head keeps catching up while the lookup drafts: the target's taps of every committed token are handed to it
(`take_hidden`), and its next chain first feeds them all in one call.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from neuron_ssp.drafters import eagle
from neuron_ssp.drafters.base import Draft, DraftMask
from neuron_ssp.drafters.eagle import EagleDrafter
from neuron_ssp.drafters.ngram import NgramDrafter
from neuron_ssp.speculation.call_cost import WidthCost
from neuron_ssp.speculation.cost_policy import AcceptanceModel, Cell
from neuron_ssp.speculation.position_noise import PositionNoise
from neuron_ssp.speculation.sampling import SamplingParams

CONFIDENCE = 0.5  # the drafter does not see the target's confidence: the middle class


@dataclass
class DraftChoice:
    """What every row's choice shares: the target's cost per width, one head call's cost, and the acceptance counts
    of each source."""

    cost: WidthCost
    head_ms: float
    lookup: AcceptanceModel = field(default_factory=AcceptanceModel)
    head: AcceptanceModel = field(default_factory=AcceptanceModel)

    def pick(self, lookup: Draft, max_tokens: int) -> tuple[bool, int]:
        """(use the head, how many tokens to draft): the source and length with the higher expected goodput."""
        lookup_rate, lookup_w = best_rate(self._chances(self.lookup, lookup.match_len, len(lookup)), self.cost, 0.0)
        head_rate, head_w = best_rate(self._chances(self.head, 0, max_tokens), self.cost, self.head_ms)
        if len(lookup) and lookup_rate >= head_rate:
            return False, lookup_w - 1
        return True, head_w - 1

    @staticmethod
    def _chances(model: AcceptanceModel, match_len: int, tokens: int) -> list[float]:
        return [model.chance(cell) for cell in model.cells(CONFIDENCE, match_len, tokens)]


def best_rate(chances: list[float], cost: WidthCost, draft_ms: float) -> tuple[float, int]:
    """(expected committed tokens per ms, window w) for the best w in 1..len(chances)+1, each drafted token
    costing `draft_ms` on top of the target call."""
    best, best_w, expected, survive = 1.0 / cost.at(1), 1, 1.0, 1.0
    for j, p in enumerate(chances):
        survive *= p
        expected += survive
        rate = expected / (cost.at(j + 2) + (j + 1) * draft_ms)
        if rate > best:
            best, best_w = rate, j + 2
    return best, best_w


class LookupOrHead:
    """One row's combined drafter: its prompt lookup, its head drafter (a slot of the shared head), the shared
    choice, and its last proposal (to learn from its outcome)."""

    def __init__(self, lookup: NgramDrafter, head: EagleDrafter, choice: DraftChoice):
        self.lookup, self.head, self.choice = lookup, head, choice
        self.vocab_size = head.vocab_size
        self._last: tuple[AcceptanceModel, list[Cell], list[int], int] | None = None  # model, cells, tokens, at

    def begin(self, prompt_ids: torch.Tensor, max_new_tokens: int, noise: PositionNoise | None = None) -> None:
        self.head.begin(prompt_ids, max_new_tokens, noise)
        self._last = None

    def take_hidden(self, start: int, hidden: torch.Tensor) -> None:
        self.head.take_hidden(start, hidden)

    @property
    def fed_positions(self) -> int:
        return self.head.fed_positions

    def resume_at(self, position: int) -> None:
        self.head.resume_at(position)

    @property
    def mask(self) -> DraftMask | None:
        """The head drafts under the row's processors; prompt lookup's point masses are cut by the loop."""
        return self.head.mask

    @mask.setter
    def mask(self, mask: DraftMask | None) -> None:
        self.head.mask = mask

    def for_row(self, slot: int, sampling: SamplingParams, rng: torch.Generator | None) -> LookupOrHead:
        """The head's slot of the row, beside prompt lookup, with the shared choice."""
        return LookupOrHead(self.lookup, self.head.for_row(slot, sampling, rng), self.choice)

    def finish(self, sequence: torch.Tensor) -> None:
        self._learn(sequence)

    def propose(self, sequence: torch.Tensor, max_tokens: int) -> Draft:
        return propose_together([(self, sequence, max_tokens)])[0]

    @staticmethod
    def propose_together(requests: Sequence[tuple[LookupOrHead, torch.Tensor, int]]) -> list[Draft]:
        """Several rows at once: the lookup's proposals, then the head's chains in lock-step for the rows that chose
        it (module-level `propose_together`): base.LockStep."""
        return propose_together(requests)

    def _learn(self, sequence: torch.Tensor) -> None:
        """The last proposal's outcome: its tokens accepted while they equal the committed ones."""
        if self._last is None:
            return
        model, cells, tokens, at = self._last
        committed = sequence[at : at + len(tokens)].tolist()
        accepted = next((i for i, (d, c) in enumerate(zip(tokens, committed, strict=False)) if d != c), len(committed))
        model.record(cells[: len(committed)], accepted)  # judged: the accepted ones and the one after
        self._last = None

    def _remember(self, model: AcceptanceModel, draft: Draft, match_len: int, at: int) -> None:
        """The proposal just made (at sequence length `at`), to learn from at the next step; nothing if empty."""
        self._last = (
            (model, model.cells(CONFIDENCE, match_len, len(draft)), draft.tokens.tolist(), at) if len(draft) else None
        )


def propose_together(requests: Sequence[tuple[LookupOrHead, torch.Tensor, int]]) -> list[Draft]:
    """Each row's lookup proposal or head chain, whichever its choice picks; the head's rows in lock-step."""
    drafts: dict[int, Draft] = {}
    to_head: dict[int, tuple[EagleDrafter, torch.Tensor, int]] = {}
    for index, (drafter, sequence, max_tokens) in enumerate(requests):
        drafter._learn(sequence)
        lookup = drafter.lookup.propose(sequence, max_tokens)
        use_head, tokens = drafter.choice.pick(lookup, max_tokens)
        if use_head and tokens > 0:
            to_head[index] = (drafter.head, sequence, tokens)
        else:
            drafts[index] = lookup.prefix(tokens)
            drafter._remember(drafter.choice.lookup, drafts[index], lookup.match_len, len(sequence))
    for index, draft in zip(to_head, eagle.propose_together(list(to_head.values())), strict=True):
        drafts[index] = draft
        drafter, sequence, _ = requests[index]
        drafter._remember(drafter.choice.head, draft, 0, len(sequence))
    return [drafts[index] for index in range(len(requests))]
