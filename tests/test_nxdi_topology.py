"""neuron.library: nxdi in the config, validate and plan: trn2 at LNC=2, NxDI's GQA sharding, its placement,
its slot rule and the fused-speculation rules. Pure logic: runs in every venv."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from topology_cases import merged, neuron_pair

from neuron_ssp.cli import main
from neuron_ssp.config import config_from_dict, load_config
from neuron_ssp.errors import UsageError
from neuron_ssp.topology import plan_all_instances, plan_deployment, validate_config
from neuron_ssp.topology.networks import Networks
from neuron_ssp.topology.nxdi_graphs import default_buckets
from neuron_ssp.topology.parallelism import heads_on_device, nxdi_heads_on_device
from neuron_ssp.topology.published_runs import TRN2_LLAMA_33_70B

CONFIGS = Path(__file__).parents[1] / "configs"
NXDI_CONFIGS = [
    "nxdi-llama31-70b-8b-trn1-bf16.yaml",
    "nxdi-llama31-70b-8b-inf2-bf16.yaml",
    "nxdi-llama33-70b-32-1b-trn2-bf16.yaml",
    "nxdi-llama33-70b-trn2-tutorial.yaml",
]


def nxdi_pair(**kwargs: object) -> dict:
    return merged(neuron_pair(**kwargs), neuron={"library": "nxdi"})


@pytest.mark.parametrize("name", NXDI_CONFIGS)
def test_each_nxdi_config_validates_and_fits(name: str) -> None:
    config = load_config(CONFIGS / name)
    assert config.neuron.library == "nxdi"
    report = validate_config(config)
    assert report.ok, report.errors
    assert plan_deployment(config).fits


def test_trn2_plan_has_64_logical_cores_and_tp_64() -> None:
    config = load_config(CONFIGS / "nxdi-llama33-70b-32-1b-trn2-bf16.yaml")
    plan = plan_deployment(config)
    assert plan.instance.neuron_cores == 64 and plan.recommended_tp == 64
    assert plan.visible_cores == "0-63" and plan.library == "nxdi"
    result = CliRunner().invoke(
        main, ["plan", str(CONFIGS / "nxdi-llama33-70b-32-1b-trn2-bf16.yaml")], env={"COLUMNS": "100"}
    )
    assert "64 logical NeuronCores (LNC=2)" in result.output and "as nxdi places them" in result.output


def test_all_instances_gains_trn2_with_nxdi_and_says_why_not_with_transformers_neuronx() -> None:
    nxdi = {p.instance.name: p for p in plan_all_instances(config_from_dict(nxdi_pair()))}
    tnx = {p.instance.name: p for p in plan_all_instances(config_from_dict(neuron_pair()))}
    assert nxdi["trn2.48xlarge"].fits and nxdi["trn2.48xlarge"].recommended_tp == 64
    assert tnx["trn2.48xlarge"].recommended_tp is None
    assert "set neuron.library: nxdi" in tnx["trn2.48xlarge"].refusal


@pytest.mark.parametrize(
    ("heads", "kv", "tp", "nxdi", "tnx"),
    [
        (64, 8, 32, (64, 32), (64, 32)),  # REPLICATE_TO_TP_DEGREE
        (64, 8, 24, (72, 24), (72, 24)),  # 24 % 8 == 0: replicated to tp, query heads padded to 72
        (9, 3, 4, (12, 12), (12, 4)),  # SmolLM2 at tp 4: 4 % 3 != 0, NxDI converts to MHA; transformers-neuronx pads
        (64, 8, 12, (72, 72), (72, 72)),  # 12 % 8 != 0: CONVERT_TO_MHA
        (64, 8, 4, (64, 8), (64, 8)),  # kv heads split over tp
        (32, 32, 24, (48, 48), (48, 48)),  # MHA: padded alike
    ],
)
def test_nxdi_shards_gqa_heads_by_its_own_rule(heads: int, kv: int, tp: int, nxdi: tuple, tnx: tuple) -> None:
    assert nxdi_heads_on_device(heads, kv, tp) == nxdi
    assert heads_on_device(heads, kv, tp) == tnx


def test_nxdi_on_trn1_warns_that_sdk_2_29_dropped_it() -> None:
    report = validate_config(config_from_dict(nxdi_pair()))
    assert report.ok
    assert any(w.field == "neuron.library" and "2.28" in w.rule for w in report.warnings)


def test_nxdi_lets_the_draft_have_its_own_tp() -> None:
    data = merged(nxdi_pair(), draft={"tp_degree": 8})
    assert validate_config(config_from_dict(data)).ok
    report = validate_config(config_from_dict(merged(neuron_pair(), draft={"tp_degree": 8})))
    assert any(p.field == "draft.tp_degree" for p in report.errors)


def test_trn2_tp_must_be_a_power_of_two() -> None:
    data = merged(nxdi_pair(instance="trn2.48xlarge", tp=64), target={"tp_degree": 48})
    report = validate_config(config_from_dict(data))
    assert any(p.field == "target.tp_degree" and "power of two" in p.rule for p in report.errors)


def test_every_window_is_k_wide_so_n_positions_covers_k_minus_1_more() -> None:
    """prompt 1024 + 256 new - 2 + k 5 = 1283 slots on NxDI; 1279 with our loop on transformers-neuronx."""
    sizes = {"target": {"n_positions": 1282}, "draft": {"n_positions": 1282}}
    errors = validate_config(config_from_dict(merged(nxdi_pair(), **sizes))).errors
    assert [(p.field, "= 1283 positions" in p.rule) for p in errors] == [("target.n_positions", True)]
    assert validate_config(config_from_dict(merged(neuron_pair(), **sizes))).ok


def test_engine_library_is_refused_on_nxdi() -> None:
    report = validate_config(config_from_dict(merged(nxdi_pair(), speculation={"engine": "library"})))
    assert [p.field for p in report.errors] == ["speculation.engine"]


def test_nxdi_fused_refuses_what_its_graph_cannot_do() -> None:
    data = merged(
        nxdi_pair(),
        speculation={"engine": "fused", "acceptor": "typical", "policy": "adaptive"},
        sampling={"temperature": 0.7},
        draft={"tp_degree": 16, "first_core": 16},
    )
    fields = {p.field for p in validate_config(config_from_dict(data)).errors}
    assert {"speculation.acceptor", "speculation.policy", "sampling.temperature", "draft.first_core"} <= fields
    ok = merged(nxdi_pair(), speculation={"engine": "fused", "acceptor": "greedy", "k": 12}, draft={"tp_degree": 16})
    assert validate_config(config_from_dict(ok)).ok  # k past tnx's 10-column histogram, draft tp dividing 32


def test_the_library_field_is_validated_with_a_hint() -> None:
    with pytest.raises(UsageError) as error:
        config_from_dict(merged(neuron_pair(), neuron={"library": "nxd"}))
    (problem,) = error.value.problems
    assert problem.field == "neuron.library" and "did you mean 'nxdi'" in problem.fix


def test_nxdi_loads_every_model_of_the_process_from_the_first_visible_core() -> None:
    """NxDI's start_rank_id is a tensor-parallel rank offset for multi-node runs (inference_demo.py:795), not a
    core: a draft on cores 32-63 at tp 32 would be asked for ranks 32-63 of a 32-rank model."""
    data = merged(nxdi_pair(instance="trn2.48xlarge", tp=32), draft={"first_core": 32})
    errors = validate_config(config_from_dict(data)).errors
    assert [(p.field, p.value) for p in errors] == [("draft.first_core", 32)]
    assert "start_rank_id" in errors[0].rule and errors[0].fix.startswith("set draft.first_core: 0")
    moved = merged(nxdi_pair(instance="trn2.48xlarge", tp=32), target={"first_core": 32}, draft={"first_core": 32})
    assert validate_config(config_from_dict(moved)).ok  # both on 32-63: NEURON_RT_VISIBLE_CORES=32-63
    assert plan_deployment(config_from_dict(moved)).visible_cores == "32-63"


@pytest.mark.parametrize("draft_positions", [1536, 4096])
def test_nxdi_fused_needs_the_draft_at_the_targets_n_positions(draft_positions: int) -> None:
    """The draft's KV cache is sized by its own max length (kv_cache_manager.py:197) but fed the target's bucket
    mask (model_base.py:1832): any other n_positions breaks the fused graph."""
    data = merged(
        nxdi_pair(), speculation={"engine": "fused", "acceptor": "greedy"}, draft={"n_positions": draft_positions}
    )
    errors = validate_config(config_from_dict(data)).errors
    assert [(p.field, p.value) for p in errors] == [("draft.n_positions", draft_positions)]
    assert errors[0].fix == "set draft.n_positions: 2048"


TUTORIAL = CONFIGS / "nxdi-llama33-70b-trn2-tutorial.yaml"
OURS_TRN2 = CONFIGS / "nxdi-llama33-70b-32-1b-trn2-bf16.yaml"


def test_the_tutorial_config_is_the_setup_aws_measured_and_plan_quotes_its_figures() -> None:
    config = load_config(TUTORIAL)
    assert TRN2_LLAMA_33_70B.differences(config) == []
    result = CliRunner().invoke(main, ["plan", str(TUTORIAL), "--engine", "fused", "--json"])
    assert result.exit_code == 0, result.output
    figures = {f["name"]: f for f in json.loads(result.output)["projection"]["figures"]}
    assert figures["target ms/token"]["value"] == 19.6 and figures["published ms/token"]["value"] == 5.3
    assert figures["published speedup"]["value"] == pytest.approx(19.6 / 5.3)
    assert figures["published ms/token"]["assumption"].startswith("measured by AWS for exactly this setup")


def test_our_trn2_config_says_where_it_differs_from_the_published_run() -> None:
    differences = TRN2_LLAMA_33_70B.differences(load_config(OURS_TRN2))
    assert "speculation.engine 'native' (published: 'fused')" in differences
    assert "draft.tp_degree 32 (published: 64)" in differences
    text = CliRunner().invoke(main, ["plan", str(OURS_TRN2), "--engine", "native"], env={"COLUMNS": "200"}).output
    assert "measured by AWS for its setup, which this config is not: it differs in speculation.engine" in text


@pytest.mark.parametrize(
    ("largest", "buckets"),
    [
        (64, [64]),
        (100, [100]),
        (128, [128]),
        (200, [128, 200]),
        (2048, [128, 256, 512, 1024, 2048]),
        (2500, [128, 256, 512, 1024, 2500]),
        (3000, [128, 256, 512, 1024, 2048, 3000]),
    ],
)
def test_default_context_buckets_are_nxdis_generate_buckets(largest: int, buckets: list[int]) -> None:
    """autobucketing.generate_buckets(128, n) at 4bcdc54b (held against the real one in test_nxdi_backend.py)."""
    assert default_buckets(128, largest) == buckets


def test_plan_counts_the_graphs_nxdi_compiles() -> None:
    ours = plan_deployment(load_config(OURS_TRN2))
    assert ours.models["target"].graphs == Networks(token=0, context=5, speculation=1)
    assert ours.models["draft"].graphs == Networks(token=1, context=5, speculation=0)
    assert ours.models["target"].context_buckets == [128, 256, 512, 1024, 2048]
    tutorial = plan_deployment(load_config(TUTORIAL))
    assert tutorial.models["target"].graphs == Networks(token=0, context=4, speculation=4)
    assert tutorial.models["draft"].graphs.total == 0  # compiled into the target's fused graphs
    text = CliRunner().invoke(main, ["plan", str(OURS_TRN2)], env={"COLUMNS": "200"}).output
    assert "target: 6 = 5 context encoding + 1 speculation; context buckets 128, 256, 512, 1024, 2048" in text


def test_nxdi_buckets_must_end_where_each_model_does() -> None:
    data = merged(
        nxdi_pair(),
        neuron={
            "library": "nxdi",
            "nxdi": {"context_encoding_buckets": [512, 2048], "token_generation_buckets": [1024, 4096]},
        },
    )
    errors = {p.field: p for p in validate_config(config_from_dict(data)).errors}
    assert set(errors) == {"neuron.nxdi.context_encoding_buckets", "neuron.nxdi.token_generation_buckets"}
    assert "target 1024, draft 1024" in errors["neuron.nxdi.context_encoding_buckets"].rule
    assert errors["neuron.nxdi.context_encoding_buckets"].fix.startswith(
        "set neuron.nxdi.context_encoding_buckets: [512, 1024]"
    )
    assert errors["neuron.nxdi.token_generation_buckets"].fix.startswith(
        "set neuron.nxdi.token_generation_buckets: [1024, 2048]"
    )


def test_nxdi_settings_are_refused_under_transformers_neuronx_and_misordered_buckets_in_the_schema() -> None:
    report = validate_config(config_from_dict(merged(neuron_pair(), neuron={"nxdi": {"fused_qkv": True}})))
    assert [(p.field, p.value) for p in report.errors] == [("neuron.nxdi", {"fused_qkv": True})]
    with pytest.raises(UsageError) as error:
        config_from_dict(
            merged(nxdi_pair(), neuron={"library": "nxdi", "nxdi": {"context_encoding_buckets": [1024, 512]}})
        )
    (problem,) = error.value.problems
    assert problem.field == "neuron.nxdi.context_encoding_buckets" and "[512, 1024]" in problem.fix


def test_nxdi_kernels_with_short_buckets_warn_of_the_tutorials_known_issue() -> None:
    data = merged(
        nxdi_pair(instance="trn2.48xlarge", tp=64), neuron={"library": "nxdi", "nxdi": {"attn_kernel_enabled": True}}
    )
    (warning,) = [w for w in validate_config(config_from_dict(data)).warnings if w.field.startswith("neuron.nxdi")]
    assert warning.field == "neuron.nxdi.attn_kernel_enabled" and "128, 256, 512, 1024" in warning.rule
    assert not [w for w in validate_config(load_config(TUTORIAL)).warnings if w.field.startswith("neuron.nxdi")]
