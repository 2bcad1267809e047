"""Projected ms/token and speedup of speculation from published per-token latencies, α and k.

No hardware: the figures rest on assumptions, and each figure carries its own, so a reader knows what
to measure (tune-k measures α, c and the call cost per width). Per iteration with window k (k-1
drafted tokens) the target commits τ = (1-α^k)/(1-α) tokens on average (Leviathan et al., i.i.d.
acceptance α) in one k-wide call, priced like a one-token call (batch 1 on Neuron is bound by reading
the weights; a k-wide call reads them once). The draft costs its own published ms/token per step:
- native: k-1 draft calls, each a host round trip (not counted: it is what `fused` removes);
- fused: FusedSpeculativeDecoder always runs the draft k times per iteration (its k + 1 with its
  k = ours - 1, fused_speculation.py at 1ade6d74), but on device, with no host round trip; NxD Inference's
  NeuronFusedSpecModel too (k draft runs, the last only to fill its cache, model_base.py:1835 at 4bcdc54b).
Where AWS published a measured run of the same pair on the same instance (topology/published_runs.py), its
figures come last, with the config fields where this config differs from that run.
"""

from __future__ import annotations

from dataclasses import dataclass

from neuron_ssp.topology.costs import published_latency
from neuron_ssp.topology.models import Architecture
from neuron_ssp.topology.published_runs import PublishedRun

DEFAULT_ALPHA = 0.8


@dataclass(frozen=True)
class Figure:
    name: str
    value: float | None
    unit: str
    assumption: str


@dataclass(frozen=True)
class Projection:
    engine: str
    k: int
    figures: list[Figure]

    @property
    def speedup(self) -> float | None:
        return next(f.value for f in self.figures if f.name == "speedup")

    def to_dict(self) -> dict[str, object]:
        return {"engine": self.engine, "k": self.k, "figures": [f.__dict__ for f in self.figures]}


def tokens_per_call(alpha: float, k: int) -> float:
    return float(k) if alpha >= 1.0 else (1.0 - alpha**k) / (1.0 - alpha)


def draft_steps(engine: str, k: int) -> int:
    """Draft forward passes per iteration: k-1 (native, host loop) or k (fused: its k + 1, its k = ours - 1)."""
    return k if engine == "fused" else k - 1


def published_or_given(
    arch: str, instance: str, given_ms: float | None, flag: str, published_label: str
) -> tuple[float | None, str]:
    """ms/token and where it comes from: given with `flag`, else published, else None (pass `flag`)."""
    if given_ms is not None:
        return given_ms, f"given ({flag})"
    published = published_latency(arch, instance)
    if published is not None:
        return published.ms_per_token, f"{published_label}: {published.source}"
    return None, f"no published latency of {arch} on {instance}: pass {flag}"


def head_step_ms(target: Architecture, head: Architecture, instance: str) -> tuple[float, str] | None:
    """An EAGLE head's ms per draft step from the target's published ms/token, by the weights each step reads
    (decoding at small batch reads every weight once; the embedding only its row), and what it assumes; None where
    the target has no published latency there."""
    latency = published_latency(target.name, instance)
    if latency is None:
        return None
    read = [arch.params - arch.vocab * arch.hidden for arch in (head, target)]
    return latency.ms_per_token * read[0] / read[1], (
        f"estimated: the target's published {latency.ms_per_token:g} ms × the weights a head step reads / the "
        f"target's ({read[0] / read[1]:.3f}; head {head.source}); measure it on the instance"
    )


def project(
    engine: str,
    k: int,
    alpha: float,
    instance: str,
    target_arch: str,
    draft_arch: str | None,
    target_ms: float | None = None,
    draft_ms: float | None = None,
    library: str = "transformers-neuronx",
    published: tuple[PublishedRun, list[str]] | None = None,
    draft_estimate: tuple[float, str] | None = None,
) -> Projection:
    """Every figure with the assumption it rests on; None where a latency is neither published nor given.
    `published`: a run AWS measured of this pair and instance, and where this config differs from it."""
    target_ms, target_note = published_or_given(
        target_arch, instance, target_ms, "--ms-per-token", "published plain decoding"
    )
    if draft_arch is None:
        draft_ms, draft_note = 0.0, "model-free drafter (prompt lookup on the host): draft cost taken as 0"
    elif draft_ms is None and draft_estimate is not None:
        draft_ms, draft_note = draft_estimate
    else:
        draft_ms, draft_note = published_or_given(draft_arch, instance, draft_ms, "--draft-ms-per-token", "published")
    tau = tokens_per_call(alpha, k)
    steps = draft_steps(engine, k)
    iteration = None if target_ms is None or draft_ms is None else target_ms + steps * draft_ms
    ms = None if iteration is None else iteration / tau
    speedup = None if ms is None or target_ms is None else target_ms / ms
    overhead = (
        "host round trip per draft token not counted (native pays it, fused does not)"
        if engine == "native"
        else "no host round trip: draft loop and acceptance on device"
    )
    fused_draft = (
        "NeuronFusedSpecModel runs the draft k times (the last fills its cache)"
        if library == "nxdi"
        else "FusedSpeculativeDecoder runs the draft its k + 1 = our k times"
    )
    return Projection(
        engine,
        k,
        [
            Figure("target ms/token", target_ms, "ms", target_note),
            Figure("draft ms/token", draft_ms, "ms", draft_note),
            Figure("α", alpha, "", "assumed acceptance rate, i.i.d. per token (measure it: neuron-ssp tune-k)"),
            Figure("tokens per target call τ", tau, "", f"(1-α^k)/(1-α) with k={k} (Leviathan et al.)"),
            Figure(
                "draft steps per call", float(steps), "", "k-1 drafted tokens" if engine == "native" else fused_draft
            ),
            Figure(
                "target call ms",
                target_ms,
                "ms",
                "a k-wide call priced like a one-token call (batch 1 reads the weights once); tune-k measures it",
            ),
            Figure("projected ms/token", ms, "ms", f"(target call + steps × draft) / τ; {overhead}"),
            Figure("speedup", speedup, "x", "target ms/token ÷ projected ms/token, same instance and tp"),
            *(_published_figures(*published) if published else []),
        ],
    )


def _published_figures(run: PublishedRun, differences: list[str]) -> list[Figure]:
    """AWS's measured figures; for another setup of the pair, which fields differ (each can move them)."""
    if differences:
        fields = ", ".join(d.split(" ", 1)[0] for d in differences)
        basis = f"measured by AWS for its setup, which this config is not: it differs in {fields}"
    else:
        basis = "measured by AWS for exactly this setup"
    figures = [
        Figure("published ms/token", run.ms_per_token, "ms", f"{basis} ({run.source})"),
        Figure(
            "published speedup",
            run.plain_ms_per_token / run.ms_per_token,
            "x",
            f"{run.plain_ms_per_token:g} ms without speculation ÷ {run.ms_per_token:g} ms with it, same setup",
        ),
    ]
    if run.throughput is not None:
        plain, speculative, speedup = run.throughput
        figures += [
            Figure("published tokens/s without speculation", plain, "tok/s", "output throughput, same setup"),
            Figure("published tokens/s with speculation", speculative, "tok/s", "output throughput"),
            Figure("published throughput speedup", speedup, "x", f"as published ({speculative:g} vs {plain:g} tok/s)"),
        ]
    if run.tokens_per_call is not None:
        figures.append(
            Figure(
                "published tokens per target call",
                run.tokens_per_call,
                "",
                "vLLM's mean acceptance length (1 + accepted / drafts, drafting steps only)",
            )
        )
    return figures
