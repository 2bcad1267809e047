"""Generation statistics, defined as vLLM and Spec-Bench define them.

- acceptance rate = accepted draft tokens / proposed draft tokens
- mean accepted length = tokens committed by decode-loop target calls / those calls (bonus included;
  the prompt's prefill call and the token it yields are left out of both)
- per-position acceptance: for draft position i (1..k-1), accepted / proposed at that position
- time split: draft, target (prefill included), overhead = wall - draft - target
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class GenerationStats:
    k: int = 1
    new_tokens: int = 0
    target_calls: int = 0
    loop_tokens: int = 0  # committed by the decode-loop target calls (for mean accepted length)
    draft_tokens: int = 0
    accepted_tokens: int = 0
    proposed_at: list[int] = field(default_factory=list)
    accepted_at: list[int] = field(default_factory=list)
    time_draft_s: float = 0.0
    time_target_s: float = 0.0
    wall_s: float = 0.0

    def __post_init__(self) -> None:
        self.proposed_at = self.proposed_at or [0] * max(self.k - 1, 0)
        self.accepted_at = self.accepted_at or [0] * max(self.k - 1, 0)

    def record_call(self, drafted: int, accepted: int, committed: int) -> None:
        """One target call that scored `drafted` draft tokens and kept `accepted` of them."""
        self.target_calls += 1
        self.loop_tokens += committed
        self.draft_tokens += drafted
        self.accepted_tokens += accepted
        for i in range(drafted):
            self.proposed_at[i] += 1
        for i in range(accepted):
            self.accepted_at[i] += 1

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0

    @property
    def mean_accepted_length(self) -> float:
        return self.loop_tokens / self.target_calls if self.target_calls else 0.0

    @property
    def per_position_acceptance(self) -> list[float | None]:
        return [a / p if p else None for a, p in zip(self.accepted_at, self.proposed_at, strict=True)]

    @property
    def time_overhead_s(self) -> float:
        return max(self.wall_s - self.time_draft_s - self.time_target_s, 0.0)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_s if self.wall_s else 0.0

    @property
    def ms_per_token(self) -> float:
        return 1000.0 * self.wall_s / self.new_tokens if self.new_tokens else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "k": self.k,
            "new_tokens": self.new_tokens,
            "acceptance_rate": self.acceptance_rate,
            "mean_accepted_length": self.mean_accepted_length,
            "target_calls": self.target_calls,
            "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted_tokens,
            "per_position_acceptance": self.per_position_acceptance,
            "tokens_per_s": self.tokens_per_s,
            "ms_per_token": self.ms_per_token,
            "wall_s": self.wall_s,
            "time_draft_s": self.time_draft_s,
            "time_target_s": self.time_target_s,
            "time_overhead_s": self.time_overhead_s,
        }
