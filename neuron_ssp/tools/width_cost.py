"""What one target call costs per window width, and the speedup that predicts for each k.

The Leviathan model prices a k-wide target call like a one-token call (c only counts the draft). That
holds on an accelerator idle at width 1; on a CPU a 10-wide call costs several one-token calls, and
the model with c ≈ 0 then predicts speedups the loop never reaches. So tune-k times the target once
per width (interleaved rounds, median) and prices both loops with that one curve:

    plain time = P + L₁ · (t(1) + h₁)        speculative time = P + L_k · (E[t(w)] + h_k)
    speedup(k) = (N_k / speculative time) ÷ (N₁ / plain time)

with P the prompts' prefill (timed with the curve), L the decode-loop target calls (for speculative
sampling L_k = committed tokens ÷ τ(k), τ from the measured acceptance), w the width each call scored
(drafted tokens + 1 where the backend scores any width, the compiled k where it pads to it: Neuron),
and h the host time per call the runs measured outside the target (drafting, acceptance, sampling,
bookkeeping: wall - target time). Leaving P and h out over-predicts by the share of time they take
(8-11 % on the embedded default). The runs' own target time is never used: on Neuron one curve plus
the acceptance of each k predicts every k.
"""

from __future__ import annotations

from collections.abc import Mapping

from neuron_ssp.speculation.call_cost import WidthCost
from neuron_ssp.speculation.stats import GenerationStats


def host_ms_per_call(stats: GenerationStats) -> float:
    """Time outside the target per decode-loop call: drafting, acceptance, sampling, bookkeeping."""
    return 1000.0 * max(stats.wall_s - stats.time_target_s, 0.0) / stats.target_calls if stats.target_calls else 0.0


def predicted_speedup_for_widths(
    plain: GenerationStats,
    ssp: GenerationStats,
    runs: int,
    draft_lengths: Mapping[int, int],
    cost: WidthCost,
    padded_width: int | None,
) -> float:
    """Speculative over plain tokens/s, both loops priced with the width curve (module docstring).

    `plain`/`ssp` are the summed stats of `runs` generations each; `draft_lengths` = {m: calls that
    drafted m tokens}; `padded_width` = k where every call scores k (Neuron)."""
    calls = sum(draft_lengths.values())
    if calls == 0 or cost.at(1) <= 0 or plain.new_tokens == 0 or ssp.new_tokens == 0:
        return 1.0
    call_ms = sum(n * cost.at(padded_width or m + 1) for m, n in draft_lengths.items()) / calls
    prefill_ms = runs * cost.mean_prefill_ms
    plain_ms = prefill_ms + plain.target_calls * (cost.at(1) + host_ms_per_call(plain))
    ssp_ms = prefill_ms + ssp.target_calls * (call_ms + host_ms_per_call(ssp))
    return (ssp.new_tokens / ssp_ms) / (plain.new_tokens / plain_ms)
