"""k policies: how wide the next speculation window is.

A window of w means w-1 drafted tokens and w positions scored by the target; w = 1 is a plain
decoding step. The window never exceeds the configured k (on Neuron: the compiled k).
Draft-confidence (stop drafting when the draft hesitates) is a rule of the model drafter, which is
the only one that sees draft probabilities: `build_draft_stop` gives its threshold.
"""

from __future__ import annotations

from neuron_ssp.config import SpeculationConfig
from neuron_ssp.speculation.call_cost import WidthCost
from neuron_ssp.speculation.cost_policy import AcceptanceModel, CostWindow, Proposal


class WindowPolicy:
    """The interface the generator drives; by itself it always opens the full window k."""

    uses_target_confidence = False
    by_goodput = False  # True: the loop chooses this policy's windows together with the batch's (CostPolicy)

    def __init__(self, k: int):
        self.k = k

    def window(self, target_confidence: float) -> int:
        return self.k

    def keep(self, draft: Proposal, target_confidence: float) -> int:
        """How many of the drafted tokens the target scores; by default all of them."""
        return len(draft)

    def chances(self, draft: Proposal, target_confidence: float) -> list[float]:
        """Per drafted token, the chance it is accepted once those before it were: what the batch's goodput
        choice weighs (policies with `by_goodput` only)."""
        raise NotImplementedError(f"{type(self).__name__} does not choose windows by goodput")

    def settle(self, draft: Proposal, chosen: int) -> int:
        """How many drafted tokens are kept when the batch chose `chosen` for this row (`by_goodput` only)."""
        raise NotImplementedError(f"{type(self).__name__} does not choose windows by goodput")

    def observe(self, drafted: int, accepted: int) -> None:
        """What the last target call kept of its draft; stateless policies ignore it."""

    def reset(self) -> None:
        """Start of a new sequence; stateless policies have nothing to forget."""


class FixedPolicy(WindowPolicy):
    """Always the full window k."""


class AdaptivePolicy(WindowPolicy):
    """Hugging Face's heuristic: +2 after a fully accepted draft, -1 after a rejection, within [k_min, k]."""

    def __init__(self, k: int, k_min: int = 2):
        super().__init__(k)
        self.k_min = k_min
        self.current = k

    def window(self, target_confidence: float) -> int:
        return self.current

    def reset(self) -> None:
        self.current = self.k

    def observe(self, drafted: int, accepted: int) -> None:
        if drafted == 0:
            return
        step = 2 if accepted == drafted else -1
        self.current = max(self.k_min, min(self.k, self.current + step))


class TargetConfidencePolicy(WindowPolicy):
    """Draft only when the target was confident in its last token; otherwise decode plainly.

    The strategy of Clay's post of 2024-11-21 (clay-atlas.com; code in ccs96307/fast-llm-inference:
    1.24x -> 1.66x for SmolLM2-1.7B/135M): where the target hesitates the draft
    is usually wrong, and a rejected window costs more than a plain step.
    """

    uses_target_confidence = True

    def __init__(self, k: int, threshold: float):
        super().__init__(k)
        self.threshold = threshold

    def window(self, target_confidence: float) -> int:
        return self.k if target_confidence >= self.threshold else 1


class CostPolicy(WindowPolicy):
    """Ask the drafter for the whole window k, then keep the part that maximises expected committed tokens
    per unit of target time, from the target's cost per width and the evidence (cost_policy.py). In a batch
    the loop weighs every row's evidence against the cost of the whole call (goodput.py)."""

    uses_target_confidence = True
    by_goodput = True

    def __init__(self, k: int, cost: WidthCost, model: AcceptanceModel | None = None):
        super().__init__(k)
        self.chooser = CostWindow(cost, model)

    @property
    def acceptance(self) -> AcceptanceModel:
        """The counts it learns; a generator derived for another request can share them."""
        return self.chooser.model

    def keep(self, draft: Proposal, target_confidence: float) -> int:
        return self.chooser.keep(draft, target_confidence, self.k - 1)

    def chances(self, draft: Proposal, target_confidence: float) -> list[float]:
        return self.chooser.chances(draft, target_confidence, self.k - 1)

    def settle(self, draft: Proposal, chosen: int) -> int:
        return self.chooser.settle(draft, chosen)

    def observe(self, drafted: int, accepted: int) -> None:
        self.chooser.observe(drafted, accepted)


def build_policy(
    spec: SpeculationConfig, cost: WidthCost | None, acceptance: AcceptanceModel | None = None
) -> WindowPolicy:
    """`cost`: the target's call cost per row count, timed once at load (call_cost.target_cost), needed by
    the policy 'cost'; `acceptance`: counts to learn into (shared with other rows), else fresh ones from the
    prior."""
    if spec.policy == "cost":
        if cost is None:
            raise ValueError("policy 'cost' needs the target's call cost (call_cost.target_cost)")
        return CostPolicy(spec.k, cost, acceptance)
    if spec.policy == "adaptive":
        return AdaptivePolicy(spec.k, spec.k_min)
    if spec.policy == "target-confidence":
        return TargetConfidencePolicy(spec.k, spec.confidence_threshold)
    return FixedPolicy(spec.k)  # fixed, and draft-confidence (whose rule lives in the drafter)


def build_draft_stop(spec: SpeculationConfig) -> float:
    """The draft's top probability below which the model drafter stops (0 = never stops early)."""
    return spec.p_min if spec.policy == "draft-confidence" else 0.0
