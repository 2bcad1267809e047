"""`plan` per batch size: device memory (KV cache x batch, weights once) against the formula worked by hand, the
networks per (batch size, bucket, k), and `plan --engine`'s tokens/s per batch with the assumptions it prints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from neuron_ssp.cli import main
from neuron_ssp.config import load_config
from neuron_ssp.topology import plan_deployment
from neuron_ssp.topology.batch_plan import batch_ladder, mean_positions_read
from neuron_ssp.topology.batch_projection import plan_batch_projection
from neuron_ssp.topology.networks import Networks, compiled_networks
from neuron_ssp.topology.projection import tokens_per_call
from neuron_ssp.topology.published_runs import TRN2_LLAMA_33_70B

ROOT = Path(__file__).resolve().parents[1]
TNX_BATCH4 = ROOT / "configs" / "llama3-70b-8b-trn1-x4-bf16.yaml"
NXDI_BATCH4 = ROOT / "configs" / "nxdi-llama33-70b-trn2-fused-batch4.yaml"

# configs/llama3-70b-8b-trn1-x4-bf16.yaml by hand: bf16 (2 bytes), tp 32, n_positions 2048, head dim 128.
# Llama-3-70B: 80 layers, 64 query / 8 kv heads; at tp 32 the kv heads are replicated to 32, one per core.
# Llama-3-8B: 32 layers, 32 query / 8 kv heads; also 32 kv heads on device, one per core.
TARGET_KV_PER_ROW = 2 * 80 * 1 * 128 * 2 * 2048  # k and v x layers x kv heads per core x head dim x bytes x positions
DRAFT_KV_PER_ROW = 2 * 32 * 1 * 128 * 2 * 2048
# weights / tp, with the 24 replicated kv heads' k and v projections (hidden x head dim each, per layer)
TARGET_WEIGHTS = (70_553_706_496 + 80 * 8192 * 128 * 2 * 24) * 2 // 32
DRAFT_WEIGHTS = (8_030_261_248 + 32 * 4096 * 128 * 2 * 24) * 2 // 32
USABLE = 12 * 2**30  # 16 GiB HBM per core, 25 % headroom


def test_memory_per_batch_is_the_formula_by_hand() -> None:
    assert (TARGET_KV_PER_ROW, DRAFT_KV_PER_ROW) == (83_886_080, 33_554_432)
    assert (TARGET_WEIGHTS, DRAFT_WEIGHTS) == (4_661_264_896, 552_222_976)
    plan = plan_deployment(load_config(TNX_BATCH4), batches=[1, 2, 4, 16])
    assert plan.usable_bytes_per_core == USABLE
    for row in plan.per_batch:
        b = row.batch
        assert row.kv_bytes_per_core == {"target": b * TARGET_KV_PER_ROW, "draft": b * DRAFT_KV_PER_ROW}
        assert row.bytes_per_core == {
            "target": TARGET_WEIGHTS + b * TARGET_KV_PER_ROW,
            "draft": DRAFT_WEIGHTS + b * DRAFT_KV_PER_ROW,
        }
        # draft and target share cores 0-31: the busiest core holds both
        assert row.busiest_core_bytes == TARGET_WEIGHTS + DRAFT_WEIGHTS + b * (TARGET_KV_PER_ROW + DRAFT_KV_PER_ROW)
        assert row.fits
    assert plan.per_batch[2].busiest_core_bytes == plan.busiest_core_bytes  # the configured batch 4 is the plan's
    by_hand = (USABLE - TARGET_WEIGHTS - DRAFT_WEIGHTS) // (TARGET_KV_PER_ROW + DRAFT_KV_PER_ROW)
    assert plan.largest_fitting_batch == by_hand == 65


def test_the_default_ladder_ends_at_the_configured_batch() -> None:
    assert batch_ladder(1) == [1] and batch_ladder(4) == [1, 2, 4] and batch_ladder(6) == [1, 2, 4, 6]
    assert [row.batch for row in plan_deployment(load_config(TNX_BATCH4)).per_batch] == [1, 2, 4]


def test_positions_read_per_row_follow_the_decoding_bucket() -> None:
    """Slots 101..200: 28 of them in the 128 bucket, 72 in the 256 one."""
    assert mean_positions_read(100, 100, [128, 256, 512]) == pytest.approx((28 * 128 + 72 * 256) / 100)
    assert mean_positions_read(1024, 512, [128, 256, 512, 1024, 2048]) == 2048
    assert mean_positions_read(5000, 10, [2048]) == 2048  # past the largest bucket: read in full


def test_networks_per_batch_bucket_and_k() -> None:
    assert compiled_networks(2048, [5], 4) == Networks(5, 5, 5, batch=4, context_batch=4)
    assert compiled_networks(2048, [5], 4, continuous=True) == Networks(5, 5, 5, batch=4, context_batch=1)
    plan = plan_deployment(load_config(TNX_BATCH4))
    assert plan.models["target"].graphs == Networks(5, 5, 5, batch=4, context_batch=1)  # our loop: rows join
    nxdi = plan_deployment(load_config(NXDI_BATCH4))
    assert nxdi.models["target"].graphs == Networks(token=0, context=4, speculation=4, batch=4, context_batch=1)
    assert nxdi.models["draft"].graphs.total == 0  # inside the fused graph


def test_tokens_per_second_per_batch_by_hand() -> None:
    config = load_config(TNX_BATCH4)
    projection = plan_batch_projection(config, plan_deployment(config), "native", 0.8, [1, 4])
    tau = tokens_per_call(0.8, 5)
    for row in projection.rows:
        b = row.batch
        target = 21.4 * (TARGET_WEIGHTS + b * TARGET_KV_PER_ROW) / (TARGET_WEIGHTS + TARGET_KV_PER_ROW)
        draft = 4.7 * (DRAFT_WEIGHTS + b * DRAFT_KV_PER_ROW) / (DRAFT_WEIGHTS + DRAFT_KV_PER_ROW)
        assert row.target_call_ms == pytest.approx(target)
        assert row.plain_tokens_per_s == pytest.approx(1000 * b / target)
        assert row.speculative_tokens_per_s == pytest.approx(1000 * b * tau / (target + 4 * draft))
    one, four = projection.rows
    assert one.speedup == pytest.approx(21.4 / ((21.4 + 4 * 4.7) / tau))  # batch 1: plan --engine's own figure
    assert four.speculative_tokens_per_s > 3 * one.speculative_tokens_per_s and four.speedup < one.speedup
    assert any("memory-bound" in a for a in projection.assumptions)


def test_plan_prints_memory_and_tokens_per_batch() -> None:
    runner = CliRunner()
    result = runner.invoke(main, ["plan", str(TNX_BATCH4), "--engine", "native"], env={"COLUMNS": "100"})
    assert result.exit_code == 0, result.output
    for text in (
        "per batch (KV cache x batch; weights once)",
        "largest batch that fits at tp 32: 65",
        "projection per batch: engine native",
        "assumed: a decoding call is memory-bound",
    ):
        assert text in result.output
    result = runner.invoke(main, ["plan", str(TNX_BATCH4), "--batch-sizes", "8,1", "--engine", "native", "--json"])
    data = json.loads(result.output)
    assert [row["batch"] for row in data["per_batch"]] == [1, 8] and data["largest_fitting_batch"] == 65
    assert [row["batch"] for row in data["projection"]["per_batch"]["rows"]] == [1, 8]
    assert runner.invoke(main, ["plan", str(TNX_BATCH4), "--batch-sizes", "0"]).exit_code == 2


def test_the_published_trn2_run_was_batch_1() -> None:
    differences = TRN2_LLAMA_33_70B.differences(load_config(NXDI_BATCH4))
    assert [d.split(" ", 1)[0] for d in differences] == ["target.batch_size"]
    assert TRN2_LLAMA_33_70B.differences(load_config(ROOT / "configs" / "nxdi-llama33-70b-trn2-tutorial.yaml")) == []
