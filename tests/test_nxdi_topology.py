"""neuron.library: nxdi in the config, validate and plan: trn2 at LNC=2, NxDI's GQA sharding, its placement,
its slot rule and the fused-speculation rules. Pure logic: runs in every venv."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from topology_cases import merged, neuron_pair

from neuron_ssp.cli import main
from neuron_ssp.config import config_from_dict, load_config
from neuron_ssp.errors import UsageError
from neuron_ssp.topology import plan_all_instances, plan_deployment, validate_config
from neuron_ssp.topology.parallelism import heads_on_device, nxdi_heads_on_device

CONFIGS = Path(__file__).parents[1] / "configs"
NXDI_CONFIGS = ["nxdi-llama31-70b-8b-trn1-bf16.yaml", "nxdi-llama31-70b-8b-inf2-bf16.yaml",
                "nxdi-llama33-70b-32-1b-trn2-bf16.yaml"]


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
    result = CliRunner().invoke(main, ["plan", str(CONFIGS / "nxdi-llama33-70b-32-1b-trn2-bf16.yaml")],
                                env={"COLUMNS": "100"})
    assert "64 logical NeuronCores (LNC=2)" in result.output and "as nxdi places them" in result.output


def test_all_instances_gains_trn2_with_nxdi_and_says_why_not_with_transformers_neuronx() -> None:
    nxdi = {p.instance.name: p for p in plan_all_instances(config_from_dict(nxdi_pair()))}
    tnx = {p.instance.name: p for p in plan_all_instances(config_from_dict(neuron_pair()))}
    assert nxdi["trn2.48xlarge"].fits and nxdi["trn2.48xlarge"].recommended_tp == 64
    assert tnx["trn2.48xlarge"].recommended_tp is None
    assert "set neuron.library: nxdi" in tnx["trn2.48xlarge"].refusal


@pytest.mark.parametrize(("heads", "kv", "tp", "nxdi", "tnx"), [
    (64, 8, 32, (64, 32), (64, 32)),  # REPLICATE_TO_TP_DEGREE
    (64, 8, 24, (72, 24), (72, 24)),  # 24 % 8 == 0: replicated to tp, query heads padded to 72
    (9, 3, 4, (12, 12), (12, 4)),  # SmolLM2 at tp 4: 4 % 3 != 0, NxDI converts to MHA; transformers-neuronx pads
    (64, 8, 12, (72, 72), (72, 72)),  # 12 % 8 != 0: CONVERT_TO_MHA
    (64, 8, 4, (64, 8), (64, 8)),  # kv heads split over tp
    (32, 32, 24, (48, 48), (48, 48)),  # MHA: padded alike
])
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
    data = merged(nxdi_pair(), speculation={"engine": "fused", "acceptor": "typical", "policy": "adaptive"},
                  sampling={"temperature": 0.7}, draft={"tp_degree": 16, "first_core": 16})
    fields = {p.field for p in validate_config(config_from_dict(data)).errors}
    assert {"speculation.acceptor", "speculation.policy", "sampling.temperature", "draft.first_core"} <= fields
    ok = merged(nxdi_pair(), speculation={"engine": "fused", "acceptor": "greedy", "k": 12}, draft={"tp_degree": 16})
    assert validate_config(config_from_dict(ok)).ok  # k past tnx's 10-column histogram, draft tp dividing 32


def test_the_library_field_is_validated_with_a_hint() -> None:
    with pytest.raises(UsageError) as error:
        config_from_dict(merged(neuron_pair(), neuron={"library": "nxd"}))
    (problem,) = error.value.problems
    assert problem.field == "neuron.library" and "did you mean 'nxdi'" in problem.fix
