"""What a deployment costs: dollars per hour and per million generated tokens at a given ms/token.

Without a measurement, the published per-token latency of the target (plain decoding, batch 1)
stands in, so the figure is the cost *before* speculation; SSp divides it by its speedup.
"""

from __future__ import annotations

from dataclasses import dataclass

from neuron_ssp.topology.published_runs import (
    TRN2_LLAMA_33_70B,
    TUTORIAL_SOURCE,
    VLLM_NEURON_LLAMA_31_8B_EAGLE3,
)


@dataclass(frozen=True)
class Latency:
    ms_per_token: float
    source: str


_AWS_BLOG = (
    'AWS Machine Learning Blog, "Faster LLMs with speculative decoding and AWS Inferentia2", '
    "2024-08-05: Trainium, batch 1"
)
_INF2_TABLES = (
    "AWS Neuron docs, transformers-neuronx performance tables: inf2.48xlarge tp 24, batch 1, midpoint of 33-35 ms"
)

# (architecture, instance) -> published latency of plain decoding. Latency depends on the cores used,
# so a figure is only quoted for the instance it was measured on; trn1n.32xlarge has the same
# Trainium chips as trn1.32xlarge (it differs in network bandwidth only).
PUBLISHED_LATENCY: dict[tuple[str, str], Latency] = {
    **{
        (architecture, instance): Latency(ms, _AWS_BLOG)
        for architecture, ms in (("llama-3-70b", 21.4), ("llama-3-8b", 4.7), ("llama-2-70b", 20.6), ("llama-2-7b", 3.7))
        for instance in ("trn1.32xlarge", "trn1n.32xlarge")
    },
    ("llama-2-70b", "inf2.48xlarge"): Latency(34.0, _INF2_TABLES),
    (TRN2_LLAMA_33_70B.target, TRN2_LLAMA_33_70B.instance): Latency(
        TRN2_LLAMA_33_70B.plain_ms_per_token,
        f"{TUTORIAL_SOURCE}, its setup without speculation (NxD Inference, tp 64, NKI kernels)",
    ),
    (VLLM_NEURON_LLAMA_31_8B_EAGLE3.target, VLLM_NEURON_LLAMA_31_8B_EAGLE3.instance): Latency(
        VLLM_NEURON_LLAMA_31_8B_EAGLE3.plain_ms_per_token,
        f"{VLLM_NEURON_LLAMA_31_8B_EAGLE3.source}, its baseline without speculation (vllm-neuron, TP 8, "
        "median time per output token at concurrency 2, not batch 1)",
    ),
}


def published_latency(architecture: str, instance_type: str) -> Latency | None:
    return PUBLISHED_LATENCY.get((architecture, instance_type))


def cost_per_million_tokens(price_per_hour: float, ms_per_token: float) -> float:
    """USD per 10^6 tokens generated one after another (batch 1) at `ms_per_token`."""
    hours_per_million = ms_per_token * 1e6 / 1000 / 3600
    return price_per_hour * hours_per_million
