"""Generation statistics, each under the name of whoever defines it.

- acceptance rate (vLLM's "draft acceptance rate", Spec-Bench's too) = accepted draft tokens /
  proposed draft tokens
- mean accepted length, Spec-Bench's τ = tokens committed by decode-loop target calls / those calls:
  bonus token included, calls that drafted nothing (plain steps) included; the prompt's prefill call
  and the token it yields are left out of both
- vLLM's mean acceptance length = 1 + accepted draft tokens / num_drafts, where num_drafts counts
  only the calls that scored at least one draft token (vllm/v1/spec_decode/metrics.py)
- per-position acceptance (ours, conditional): at draft position i (1..k-1), accepted / drafts that
  reached position i; vLLM's per-position acceptance rate divides by num_drafts instead
- time split: draft (the drafter's calls, its prompt encoding included), target (prefill included),
  overhead = wall - draft - target (acceptor, sampling, bookkeeping)

Draft tokens the acceptor kept after an end-of-sequence token are not committed, so they count as
neither accepted nor proposed. An engine that cannot stop at every EOS (transformers-neuronx's fused
decoder stops at one id) counts what it generated past the EOS in `tokens_after_eos`: when that is
not 0, wall time, tokens/s and its acceptance counts include that work.

Totals over many generations (`merge_stats`) are ratios of sums, as Spec-Bench and vLLM report them,
never means of per-prompt ratios, so a 10-token answer weighs less than a 128-token one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any


@dataclass
class GenerationStats:
    k: int = 1
    new_tokens: int = 0
    target_calls: int = 0
    loop_tokens: int = 0  # committed by the decode-loop target calls (for mean accepted length)
    num_drafts: int = 0  # target calls that scored at least one draft token (vLLM's num_drafts)
    draft_tokens: int = 0
    accepted_tokens: int = 0
    proposed_at: list[int] = field(default_factory=list)
    accepted_at: list[int] = field(default_factory=list)
    time_draft_s: float = 0.0
    time_target_s: float = 0.0
    wall_s: float = 0.0
    tokens_after_eos: int = 0  # generated past an EOS the engine could not stop at (cut on the host)
    cached_tokens: int = 0  # prompt tokens not prefilled: their keys and values were in the cache (prefix caching)

    def __post_init__(self) -> None:
        self.proposed_at = self.proposed_at or [0] * max(self.k - 1, 0)
        self.accepted_at = self.accepted_at or [0] * max(self.k - 1, 0)

    def record_call(self, drafted: int, accepted: int, committed: int) -> None:
        """One target call that scored `drafted` draft tokens, kept `accepted` of them and committed
        `committed` tokens (fewer than accepted + 1 when an end-of-sequence token cut the block)."""
        accepted = min(accepted, committed)
        if committed <= accepted:  # the block ended at a draft token: later drafts were never judged
            drafted = accepted
        self.target_calls += 1
        self.loop_tokens += committed
        self.num_drafts += drafted > 0
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
        """Spec-Bench's τ: committed tokens per decode-loop target call."""
        return self.loop_tokens / self.target_calls if self.target_calls else 0.0

    @property
    def vllm_mean_acceptance_length(self) -> float:
        """vLLM's: 1 + accepted / num_drafts (1 when nothing was drafted, as vLLM reports it)."""
        return 1.0 + self.accepted_tokens / self.num_drafts if self.num_drafts else 1.0

    @property
    def per_position_acceptance(self) -> list[float | None]:
        return [a / p if p else None for a, p in zip(self.accepted_at, self.proposed_at, strict=True)]

    @property
    def vllm_per_position_acceptance(self) -> list[float | None]:
        return [a / self.num_drafts if self.num_drafts else None for a in self.accepted_at]

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
            "num_drafts": self.num_drafts,
            "vllm_mean_acceptance_length": self.vllm_mean_acceptance_length,
            "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted_tokens,
            "per_position_acceptance": self.per_position_acceptance,
            "vllm_per_position_acceptance": self.vllm_per_position_acceptance,
            "tokens_per_s": self.tokens_per_s,
            "ms_per_token": self.ms_per_token,
            "wall_s": self.wall_s,
            "time_draft_s": self.time_draft_s,
            "time_target_s": self.time_target_s,
            "time_overhead_s": self.time_overhead_s,
            "tokens_after_eos": self.tokens_after_eos,
        }


def merge_stats(runs: Sequence[GenerationStats]) -> GenerationStats:
    """One GenerationStats holding the sums of `runs` (all of the same window k): every counter and
    time is summed, the per-position lists position by position."""
    total = GenerationStats(k=max((r.k for r in runs), default=1))
    for run in runs:
        for name in (f.name for f in fields(GenerationStats) if f.name != "k"):
            mine, theirs = getattr(total, name), getattr(run, name)
            if isinstance(mine, list):
                setattr(total, name, [a + b for a, b in zip(mine, theirs, strict=True)])
            else:
                setattr(total, name, mine + theirs)
    return total


def throughput_ratio(faster: GenerationStats, baseline: GenerationStats) -> float:
    """tokens/s of `faster` over tokens/s of `baseline` (0 when the baseline made nothing)."""
    return faster.tokens_per_s / baseline.tokens_per_s if baseline.tokens_per_s else 0.0
