"""The Leviathan et al. (2023) speedup model: what the measured α and c predict for a window k.

k is the window (k-1 drafted tokens, γ = k-1 in the paper). With each drafted token accepted
independently with probability α, a target call that checks m drafted tokens commits
(1-α^(m+1))/(1-α) tokens on average (the bonus token included) and costs one target run plus m draft
runs of relative cost c. The paper assumes every call drafts k-1 tokens; a prompt-lookup drafter often
proposes fewer (or none), so `predicted_speedup_for_drafts` takes the measured mix of draft lengths.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from neuron_ssp.speculation.stats import GenerationStats


def expected_tokens_per_call(alpha: float, drafted: int) -> float:
    """(1-α^(m+1))/(1-α): tokens one target call commits when it checks `drafted` = m tokens."""
    if alpha >= 1.0:
        return float(drafted + 1)
    return (1.0 - alpha ** (drafted + 1)) / (1.0 - alpha)


def predicted_speedup(alpha: float, k: int, c: float) -> float:
    """The paper's formula: every call drafts k-1 tokens."""
    return expected_tokens_per_call(alpha, k - 1) / ((k - 1) * c + 1.0)


def predicted_speedup_for_drafts(alpha: float, c: float, draft_lengths: Mapping[int, int]) -> float:
    """The same model averaged over the measured draft lengths {m: number of target calls that drafted m}.

    Tokens per call and cost per call are both averaged over calls: E[(1-α^(m+1))/(1-α)] / (1 + c·E[m]).
    With every call drafting k-1 tokens this is exactly `predicted_speedup`.
    """
    calls = sum(draft_lengths.values())
    if calls == 0:
        return 1.0
    tokens = sum(n * expected_tokens_per_call(alpha, m) for m, n in draft_lengths.items()) / calls
    mean_drafted = sum(n * m for m, n in draft_lengths.items()) / calls
    return tokens / (1.0 + c * mean_drafted)


def draft_length_counts(stats: GenerationStats) -> Counter[int]:
    """{m: calls that drafted exactly m tokens}, read from the per-position proposal counts."""
    proposed = [stats.target_calls, *stats.proposed_at, 0]  # proposed[i] = calls that drafted >= i tokens
    return Counter(
        {m: proposed[m] - proposed[m + 1] for m in range(len(proposed) - 1) if proposed[m] - proposed[m + 1] > 0}
    )


def full_draft_fraction(draft_lengths: Mapping[int, int], k: int) -> float:
    """Share of target calls that checked a full draft of k-1 tokens."""
    calls = sum(draft_lengths.values())
    return draft_lengths.get(k - 1, 0) / calls if calls else 0.0
