"""The cost policy: keep the part of a proposal that maximises expected tokens per unit of time.

Keeping w-1 of the drafted tokens commits on average E(w) = 1 + Σ_{i<w} Π_{j≤i} p_j tokens, with p_j the
chance that drafted token j is accepted once tokens 1..j-1 were, and costs one target call of width w,
t(w), measured per width on the loaded target (call_cost.py). The policy keeps the w that maximises
E(w) / t(w); w = 1 (no draft) is a plain step, 1 / t(1). A cheap wide call (Neuron, a GPU, the packed
CPU forward) makes even a weak draft worth checking; an expensive one (a CPU through a GEMM that costs
1.6-2x a matrix-vector product) keeps only drafts the evidence backs.

On Neuron a window narrower than the compiled k pads to it, so t(w) = t(k) for every w >= 2: E grows
with w, so the best choice is the whole proposal or nothing, i.e. "draft to k when it pays".

p_j comes from `AcceptanceModel`: Beta counts per cell of evidence (the draft position, the target's
probability for its last token, the drafter's match length), seeded with the rates measured on the
choose half of the dev + more prompts with the embedded model and updated with every outcome the
loop reports, so they follow another model or workload after a few hundred drafted tokens. A pipeline's
greedy generations share one set of counts; a sampled one starts from the prior, because the windows it
chooses decide which random numbers the acceptor draws, and a seed must reproduce its output
(`Pipeline._generator_for`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from neuron_ssp.speculation.call_cost import WidthCost
from neuron_ssp.speculation.goodput import goodput_windows


class Proposal(Protocol):
    """What the policy reads of a drafter's proposal (drafters.base.Draft has it)."""

    @property
    def match_len(self) -> int: ...

    @property
    def deterministic(self) -> bool: ...

    @property
    def certain(self) -> int:
        """Leading tokens the row's grammar forces: priced as certain, not evidence about the drafter."""
        ...

    def __len__(self) -> int: ...


CONFIDENCE_EDGES = (0.3, 0.7)  # the target's probability for its last token: low / middle / high
MATCH_EDGES = (1, 3)  # match length: unknown (0, a draft model) / short (1-2) / long (3+)
POSITIONS = 3  # draft position 1, 2, 3 and later
PRIOR_WEIGHT = 8.0  # the prior counts as this many observed outcomes per cell

Cell = tuple[int, int, int]  # (position class, confidence class, match class)


def _bucket(value: float, edges: tuple[float, ...]) -> int:
    return sum(value >= edge for edge in edges)


# Acceptance rate per cell with every drafted token scored (k 16, ngram (n-grams 1..4) and suffix drafters), on
# the choose half of the dev + more prompts with the embedded model: `python benchmarks/policy_replay.py prior`.
# PRIOR[position][confidence] = (match unknown: both pooled, short match, long match)
PRIOR = (
    ((0.38, 0.36, 0.64), (0.40, 0.36, 0.60), (0.45, 0.37, 0.77)),
    ((0.63, 0.60, 0.76), (0.64, 0.62, 0.72), (0.69, 0.62, 0.82)),
    ((0.82, 0.82, 0.80), (0.83, 0.80, 0.90), (0.86, 0.76, 0.93)),
)


@dataclass
class AcceptanceModel:
    """p_j per evidence cell: (accepted + prior·w) / (judged + w), counted for as long as it is held (a
    pipeline's greedy generations share one)."""

    accepted: dict[Cell, float] = field(default_factory=dict)
    judged: dict[Cell, float] = field(default_factory=dict)

    def cells(self, confidence: float, match_len: int, m: int) -> list[Cell]:
        conf, match = _bucket(confidence, CONFIDENCE_EDGES), _bucket(match_len, MATCH_EDGES)
        return [(min(j, POSITIONS - 1), conf, match) for j in range(m)]

    def chance(self, cell: Cell) -> float:
        position, confidence, match = cell
        prior = PRIOR[position][confidence][match]
        return (self.accepted.get(cell, 0.0) + prior * PRIOR_WEIGHT) / (self.judged.get(cell, 0.0) + PRIOR_WEIGHT)

    def record(self, cells: list[Cell], accepted: int) -> None:
        """The target accepted the first `accepted` of these drafted tokens; the one after was rejected."""
        for j, cell in enumerate(cells[: accepted + 1]):
            self.judged[cell] = self.judged.get(cell, 0.0) + 1.0
            self.accepted[cell] = self.accepted.get(cell, 0.0) + (j < accepted)


def best_window(chances: list[float], cost: WidthCost) -> int:
    """The w in 1..len(chances)+1 with the most expected committed tokens per millisecond of target call."""
    return goodput_windows([chances], cost)[0] + 1


class CostWindow:
    """What `CostPolicy` keeps of each proposal, and what it learns from the outcome."""

    def __init__(self, cost: WidthCost, model: AcceptanceModel | None = None):
        self.cost = cost
        self.model = model or AcceptanceModel()
        self._pending: list[Cell] = []
        self._certain = 0

    def chances(self, draft: Proposal, target_confidence: float, asked: int) -> list[float]:
        """p_j for each drafted token the proposal may bring. `asked`: how many tokens the drafter was asked
        for. A sampled draft may stop early on its own tokens (a stop rule), so its length is not evidence
        known before the tokens were drawn: the chances then run over the whole `asked`, and `settle` cuts
        what is kept to what came."""
        horizon = len(draft) if draft.deterministic else max(asked, len(draft))
        self._certain = draft.certain
        self._pending = self.model.cells(target_confidence, draft.match_len, horizon - draft.certain)
        return [1.0] * draft.certain + [self.model.chance(cell) for cell in self._pending]

    def settle(self, draft: Proposal, chosen: int) -> int:
        """The window chosen for the last proposal (by this row alone or by the batch): what is kept of it."""
        kept = min(chosen, len(draft))
        self._certain = min(self._certain, kept)
        self._pending = self._pending[: kept - self._certain]
        return kept

    def keep(self, draft: Proposal, target_confidence: float, asked: int) -> int:
        """What one request alone keeps: the best window for its own call."""
        chances = self.chances(draft, target_confidence, asked)
        return self.settle(draft, best_window(chances, self.cost) - 1)

    def observe(self, drafted: int, accepted: int) -> None:
        """What the target kept; the drafter's tokens behind the forced ones are evidence, the forced ones not."""
        certain = self._certain
        if drafted > certain and accepted >= certain:
            self.model.record(self._pending[: drafted - certain], accepted - certain)
        self._pending, self._certain = [], 0
