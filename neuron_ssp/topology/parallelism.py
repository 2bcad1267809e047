"""Which tensor-parallel degrees each Neuron platform accepts, and which AWS has tested.

The compiler rejects (or the runtime fails to load) a tp degree the chip topology cannot map;
degrees that are allowed but outside the tested set may work but are off the beaten path.
"""

from __future__ import annotations

import math

from neuron_ssp.topology.catalog import Generation

# Neuron docs: the tp degrees tested for transformers-neuronx on each platform; trn2 (NxD Inference only): the
# degrees of the NxDI Trn2 tutorials (Llama-3.1-405B and Llama-3.3-70B at 64, the 70B data-parallel one at 32) and
# vllm-neuron's EAGLE-3 tutorial (Llama-3.1-8B at 8, tutorial-eagle3-speculative-decoding-llama-3-1.md:52).
TESTED_TP: dict[str, tuple[int, ...]] = {"trn1": (1, 2, 8, 16, 32), "inf2": (1, 2, 4, 8, 12, 24), "trn2": (8, 32, 64)}

TP_RULE: dict[str, str] = {
    "trn1": "Trn1 accepts tp_degree 1, 2, 8, 16 or a multiple of 32",
    "inf2": "Inf2 accepts tp_degree 1 or a multiple of 2",
    "trn2": "Trn2 at LNC=2 (64 logical NeuronCores) accepts a power of two up to 64 with NxD Inference",
}


# The instance generations each Neuron library runs on: transformers-neuronx never supported Trn2; NxD Inference
# runs on all three (Trn1/Inf2 models up to SDK 2.28, NxDI 0.8; Trn2 and newer only from SDK 2.29, its release notes);
# vllm-neuron (SDK 2.31+) on trn2 and trn3 (its setup guide, aws-neuron-sdk 81ce03ae
# vllm-neuron/docs/getting-started/setup-guide.md:28-30, :290), of which the catalog holds trn2
GENERATIONS: dict[str, tuple[str, ...]] = {
    "transformers-neuronx": ("inf2", "trn1"),
    "nxdi": ("inf2", "trn1", "trn2"),
    "vllm-neuron": ("trn2",),
}


def runs_on(library: str, generation: str) -> bool:
    return generation in GENERATIONS[library]


def tp_allowed(generation: Generation, tp_degree: int) -> bool:
    """The rule of the AWS Machine Learning Blog post of 2024-08-05: Trn1 1, 2, 8, 16 or a multiple
    of 32; Inf2 1 or a multiple of 2."""
    if generation == "trn1":
        return tp_degree in (1, 2, 8, 16) or tp_degree % 32 == 0
    if generation == "inf2":
        return tp_degree == 1 or tp_degree % 2 == 0
    return tp_degree & (tp_degree - 1) == 0  # trn2 (NxD Inference): collectives over a power-of-two group


def tp_tested(generation: Generation, tp_degree: int) -> bool:
    return tp_degree in TESTED_TP.get(generation, ())


def allowed_tp_degrees(generation: Generation, cores: int) -> list[int]:
    """Every tp degree the platform accepts that fits in `cores` cores, smallest first."""
    return [tp for tp in range(1, cores + 1) if tp_allowed(generation, tp)]


def nearest_allowed(generation: Generation, tp_degree: int, cores: int) -> list[int]:
    """The allowed degrees just below and just above `tp_degree` (within the instance)."""
    allowed = allowed_tp_degrees(generation, cores)
    below = [tp for tp in allowed if tp < tp_degree][-1:]
    above = [tp for tp in allowed if tp > tp_degree][:1]
    return below + above


def padded_heads(heads: int, tp_degree: int) -> int:
    """Heads after transformers-neuronx pads them to a multiple of tp (equal to `heads` if none)."""
    return math.ceil(heads / tp_degree) * tp_degree


# How transformers-neuronx lays out key/value heads that tp does not divide, by library generation.
KV_PADDING = "padding"  # from c8d6bdc (June 2024, pip 0.11 / SDK 2.19) on: utils.get_qkv_padding
KV_REPLICATED_TO_HEADS = "replicated-to-heads"  # 0.10 (SDK 2.18; 7a30b42, 0623de2)
KV_RULES = {
    KV_PADDING: "transformers-neuronx 0.11+ (utils.get_qkv_padding): kv heads replicated only up to tp where "
    "that maps each core's query heads onto one kv head",
    KV_REPLICATED_TO_HEADS: "transformers-neuronx 0.10 (decoder.py to_neuron at 7a30b42/0623de2): every kv head "
    "repeated up to the query heads (GQA.REPLICATED_HEADS)",
}


def kv_rule_for_version(version: str) -> str:
    """The kv-head rule of a transformers-neuronx version string ('0.10.0.21' -> replicated to heads)."""
    parts = version.split(".")
    return KV_REPLICATED_TO_HEADS if parts[:2] == ["0", "10"] else KV_PADDING


def heads_on_device(heads: int, kv_heads: int, tp_degree: int, kv_rule: str = KV_PADDING) -> tuple[int, int]:
    """(query heads, key/value heads) that transformers-neuronx places over all cores when no
    `group_query_attention` is configured, so that both divide evenly by tp.

    Query heads are padded to a multiple of tp (the output projection with them). Key/value heads:
    with as many as query heads (MHA) they are padded alike; with fewer (GQA) they are split when tp
    divides them, and otherwise replicated (GQA.REPLICATED_HEADS). From c8d6bdc on (`KV_PADDING`):
    up to tp when that maps each core's query heads onto one kv head, else up to the padded query
    heads (`decoder.py` check_gqa_fallback and `utils.py` get_qkv_padding at 1ade6d7). In 0.10
    (`KV_REPLICATED_TO_HEADS`, decoder.py lines 89-159 and 969-996 at 7a30b42): always up to the
    query heads, then padded with them, so a 70B at tp 32 holds 64 kv heads, not 32."""
    q_heads = padded_heads(heads, tp_degree)
    if kv_heads == heads:
        return q_heads, q_heads
    if kv_heads % tp_degree == 0:
        return q_heads, kv_heads  # GQA.SHARD_OVER_HEADS
    if kv_rule == KV_REPLICATED_TO_HEADS:
        return q_heads, q_heads
    extra = q_heads - heads
    if (
        kv_heads < tp_degree
        and tp_degree % kv_heads == 0
        and (heads % tp_degree == 0 or (extra > 0 and extra % kv_heads == 0))
    ):
        replicas = tp_degree // kv_heads
    elif q_heads * kv_heads == heads * tp_degree:  # each core's query heads share one kv head
        replicas = 1
    else:
        replicas = heads // kv_heads
    replicated = max(kv_heads * replicas, tp_degree)
    return q_heads, q_heads if replicated == heads else replicated


def nxdi_heads_on_device(heads: int, kv_heads: int, tp_degree: int) -> tuple[int, int]:
    """(query heads, key/value heads) that NxD Inference places over all ranks. Query heads are padded to a
    multiple of tp; GQA key/value heads are kept when tp divides them, replicated to tp when tp is a multiple
    of them (GQA.REPLICATE_TO_TP_DEGREE, the default), otherwise converted to MHA (as many as the padded query
    heads). Source: aws-neuron/neuronx-distributed-inference modules/attention/gqa.py
    (determine_sharding_strategy, get_shardable_head_counts, lines 62-101) at 4bcdc54b."""
    q_heads = padded_heads(heads, tp_degree)
    if kv_heads == heads:
        return q_heads, q_heads
    if kv_heads >= tp_degree and kv_heads % tp_degree == 0:
        return q_heads, kv_heads
    if tp_degree % kv_heads == 0:
        return q_heads, tp_degree
    return q_heads, q_heads


def device_heads(library: str, heads: int, kv_heads: int, tp_degree: int, kv_rule: str = KV_PADDING) -> tuple[int, int]:
    """The head counts on device under the library that shards them (transformers-neuronx: by version)."""
    if library in ("nxdi", "vllm-neuron"):  # vllm-neuron: taken to shard as NxDI does (its source is not read here)
        return nxdi_heads_on_device(heads, kv_heads, tp_degree)
    return heads_on_device(heads, kv_heads, tp_degree, kv_rule)
