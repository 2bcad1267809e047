"""Per-core memory counts heads as transformers-neuronx places them; every refused instance says why.

The head arithmetic follows aws-neuron/transformers-neuronx (commit 1ade6d7): `decoder.py`
check_gqa_fallback picks kv-head replication when tp does not divide the kv heads, and `utils.py`
get_qkv_padding pads query heads to a multiple of tp and says how far kv heads are replicated.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from topology_cases import neuron_pair

from neuron_ssp.cli import main
from neuron_ssp.config import config_from_dict
from neuron_ssp.topology import plan_all_instances, plan_deployment
from neuron_ssp.topology.catalog import GIB
from neuron_ssp.topology.memory import footprint
from neuron_ssp.topology.models import ARCHITECTURES
from neuron_ssp.topology.parallelism import KV_REPLICATED_TO_HEADS, heads_on_device

# (query heads, kv heads, tp) -> (query heads, kv heads) on device, all cores together
HEADS = [
    ((64, 8, 8), (64, 8)),  # Llama-2/3-70B: tp divides the kv heads, they are split
    ((64, 8, 12), (72, 72)),  # 12 does not divide 8, nor 8 12: fully replicated, padded with the queries
    ((64, 8, 16), (64, 16)),  # replicated up to tp: one kv head per core
    ((64, 8, 24), (72, 24)),  # queries padded to 72; kv heads replicated 3x
    ((64, 8, 32), (64, 32)),
    ((32, 32, 12), (36, 36)),  # Llama-2-7B (MHA): k and v padded like the queries
    ((32, 32, 24), (48, 48)),
    ((32, 8, 24), (48, 24)),  # Llama-3-8B
    ((9, 3, 4), (12, 4)),  # each core's 3 query heads share one kv head, then at least tp
]


@pytest.mark.parametrize("shape, expected", HEADS)
def test_heads_on_device(shape: tuple[int, int, int], expected: tuple[int, int]) -> None:
    assert heads_on_device(*shape) == expected


# transformers-neuronx 0.10 (7a30b42, 0623de2): kv heads tp does not divide are repeated up to the query heads
HEADS_0_10 = [
    ((64, 8, 8), (64, 8)),  # tp divides them: split, as later
    ((64, 8, 32), (64, 64)),  # 0.11+: 32
    ((64, 8, 24), (72, 72)),  # 0.11+: 24
    ((32, 8, 24), (48, 48)),  # Llama-3-8B; 0.11+: 24
    ((32, 32, 24), (48, 48)),  # MHA: padded like the queries, as later
]


@pytest.mark.parametrize("shape, expected", HEADS_0_10)
def test_heads_on_device_at_0_10(shape: tuple[int, int, int], expected: tuple[int, int]) -> None:
    assert heads_on_device(*shape, KV_REPLICATED_TO_HEADS) == expected


def test_a_70b_at_tp_32_on_0_10_costs_a_third_of_a_gib_more_weights_and_twice_the_kv_cache_per_core() -> None:
    llama70 = ARCHITECTURES["llama-3-70b"]
    later = footprint(llama70, "bf16", 32, 2048, 1)
    early = footprint(llama70, "bf16", 32, 2048, 1, kv_rule=KV_REPLICATED_TO_HEADS)
    assert (later.kv_heads_on_device, early.kv_heads_on_device) == (32, 64)
    assert round((early.weight_bytes_per_core - later.weight_bytes_per_core) / GIB, 2) == 0.31
    assert early.kv_bytes_per_core == 2 * later.kv_bytes_per_core


def test_plan_and_validate_follow_the_library_version_asked(tmp_path) -> None:
    import yaml

    pair = neuron_pair(instance="trn1.32xlarge", tp=32)
    pair["target"]["n_positions"] = pair["draft"]["n_positions"] = 90_000
    path = tmp_path / "long.yaml"
    path.write_text(yaml.safe_dump(pair))
    assert CliRunner().invoke(main, ["validate", str(path)]).exit_code == 0
    early = CliRunner().invoke(main, ["validate", str(path), "--neuronx-version", "0.10.0.21", "--json"])
    (error,) = json.loads(early.output)["errors"]
    assert early.exit_code == 1 and "replicated to 64 by transformers-neuronx 0.10" in error["rule"]
    planned = CliRunner().invoke(main, ["plan", str(path), "--neuronx-version", "0.10", "--json"])
    assert json.loads(planned.output)["kv_rule"] == KV_REPLICATED_TO_HEADS


# architecture, tp -> weights per core, KV cache per core (GiB, bf16, 2048 positions, batch 1)
PER_CORE = [
    ("llama-2-70b", 12, 12.58, 0.47),  # was 10.71 + 0.08 before padding and replication were counted
    ("llama-2-70b", 24, 5.67, 0.08),
    ("llama-2-70b", 32, 4.25, 0.08),
    ("llama-2-7b", 12, 1.09, 0.09),
    ("llama-2-7b", 32, 0.39, 0.03),
]


@pytest.mark.parametrize("name, tp, weights, kv", PER_CORE)
def test_per_core_memory_counts_padded_and_replicated_heads(name: str, tp: int, weights: float, kv: float) -> None:
    usage = footprint(ARCHITECTURES[name], "bf16", tp, 2048, 1)
    assert (round(usage.weight_bytes_per_core / GIB, 2), round(usage.kv_bytes_per_core / GIB, 2)) == (weights, kv)


def test_padding_adds_exactly_the_extra_attention_weights() -> None:
    """70B at tp 12: q and o grow 64 -> 72 heads, k and v 8 -> 72, over 80 layers of hidden 8192."""
    llama70 = ARCHITECTURES["llama-2-70b"]
    added = 80 * 8192 * 128 * (2 * (72 - 64) + 2 * (72 - 8))
    assert footprint(llama70, "bf16", 12, 1, 1).weight_bytes_per_core == -(-(llama70.params + added) * 2 // 12)


def test_inf2_24xlarge_does_not_host_llama2_70b_with_7b_in_bf16() -> None:
    """Today's plan says it fits at tp 12 (busiest core 11.92 of 12.00 GiB); with the heads counted
    the busiest core holds 14.23 GiB."""
    plan = plan_deployment(config_from_dict(neuron_pair(instance="inf2.24xlarge", tp=12)))
    assert round(plan.busiest_core_bytes / GIB, 2) == 14.23
    assert not plan.fits and plan.fitting_tp_degrees == []
    assert "tp 12" in plan.refusal and "64/8 -> 72/72" in plan.refusal


def test_every_refused_instance_says_why() -> None:
    plans = {p.instance.name: p for p in plan_all_instances(config_from_dict(neuron_pair()))}
    assert plans["trn2.48xlarge"].refusal.startswith(
        "transformers-neuronx does not support trn2 (NxD Inference does: set neuron.library: nxdi"
    )
    assert "it has 2 cores" in plans["inf2.xlarge"].refusal
    refused = [p for p in plans.values() if p.recommended_tp is None]
    assert refused and all(p.refusal for p in refused)
    assert all(p.refusal is None for p in plans.values() if p.recommended_tp is not None)


def test_all_instances_prints_each_reason(tmp_path) -> None:
    import yaml

    path = tmp_path / "pair.yaml"
    path.write_text(yaml.safe_dump(neuron_pair()))
    result = CliRunner().invoke(main, ["plan", str(path), "--all-instances"], env={"COLUMNS": "80"})
    text = " ".join(result.output.split())
    assert "trn2.48xlarge: no, transformers-neuronx does not support trn2 (NxD Inference does: set" in text
    assert "inf2.24xlarge: no, at tp 12" in text
