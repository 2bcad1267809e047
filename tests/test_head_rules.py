"""EAGLE heads on Neuron: which library runs which head, from which SDK, through which engine (topology/head_rules.py),
what NxD Inference and vllm-neuron ask of the config and the head, all refused at once with field, rule and fix."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from eagle_support import tiny_head

from neuron_ssp.config import config_from_dict
from neuron_ssp.topology import plan_deployment, validate_config
from neuron_ssp.topology.head_rules import HEAD_RULES, head_problems

TARGET = "/models/Llama-3.1-8B-Instruct"
HEAD = "/models/EAGLE3-LLaMA3.1-Instruct-8B"


def eagle(library: str = "nxdi", drafter: str = "eagle3", **sections: Any) -> Any:
    model = {"tp_degree": 8, "dtype": "bf16", "n_positions": 2048}
    data: dict[str, Any] = {
        "platform": {"backend": "neuron", "instance_type": "trn2.48xlarge"},
        "target": {"path": TARGET, **model},
        "draft": {"path": HEAD, **model},
        "speculation": {"drafter": drafter, "k": 4, "acceptor": "greedy", "engine": "fused"},
        "neuron": {"library": library, "self_test": False},
    }
    if library == "nxdi":
        data["neuron"]["nxdi"] = {"sequence_parallel_enabled": True}
    if library == "vllm-neuron":
        data["speculation"]["engine"] = "native"
    for section, values in sections.items():
        data[section] = {**data.get(section, {}), **values}
    return config_from_dict(data)


def errors(config: Any) -> dict[str, str]:
    return {p.field: p.rule for p in validate_config(config).errors}


@pytest.mark.parametrize("library", ["nxdi", "vllm-neuron"])
def test_eagle3_runs_on_nxdi_and_vllm_neuron_on_trn2(library: str) -> None:
    assert errors(eagle(library)) == {}


def test_every_library_and_head_has_one_row_with_its_source() -> None:
    pairs = [(r.library, r.drafter) for r in HEAD_RULES]
    assert len(pairs) == len(set(pairs)) == 6
    assert all(".py:" in r.source or ".md:" in r.source or ".rst:" in r.source for r in HEAD_RULES)


def test_heads_a_library_does_not_run_are_refused_with_the_reason() -> None:
    assert "speculative_decoding_design.md:77" in errors(eagle("vllm-neuron", "eagle"))["speculation.drafter"]
    tnx = eagle("transformers-neuronx", "eagle", platform={"instance_type": "trn1.32xlarge"})
    assert "fused_speculation.py:353" in errors(tnx)["speculation.drafter"]
    tnx3 = eagle("transformers-neuronx", "eagle3", platform={"instance_type": "trn1.32xlarge"})
    assert "EAGLE-1 only" in errors(tnx3)["speculation.drafter"]


def test_an_older_sdk_and_the_wrong_engine_are_refused_together() -> None:
    problems = head_problems(eagle(speculation={"engine": "native"}), sdk="2.27")
    assert [p.field for p in problems] == ["neuron.library", "speculation.engine"]
    assert "2.28" in problems[0].rule and problems[1].fix == "set speculation.engine: fused"
    assert head_problems(eagle(), sdk="2.28") == []


def test_nxdi_eagle3_needs_sequence_parallelism_and_buckets_that_are_no_window() -> None:
    config = eagle(neuron={"library": "nxdi", "nxdi": {"context_encoding_buckets": [4, 2048]}})
    found = errors(config)
    assert "(:964-976)" in found["neuron.nxdi.sequence_parallel_enabled"]
    assert "model_base.py:2878" in found["neuron.nxdi.context_encoding_buckets"]


def test_the_sequence_parallel_fix_says_the_head_runs_with_it_too() -> None:
    """The head runs with the target's sequence parallelism (backends/nxdi/api.py eagle_head, inference_demo.py:504-
    518); a head without it fails context encoding at tp > 1 (tests/test_nxdi_shipped_tp2.py)."""
    config = eagle(neuron={"library": "nxdi", "nxdi": {"sequence_parallel_enabled": False}})
    (fix,) = [p.fix for p in validate_config(config).errors if p.field == "neuron.nxdi.sequence_parallel_enabled"]
    assert "the head runs with it too" in fix and "runs without it" not in fix


def test_vllm_neuron_runs_on_trn2_only_and_its_own_loop() -> None:
    found = errors(
        eagle("vllm-neuron", platform={"instance_type": "trn1.32xlarge"}, speculation={"policy": "adaptive"})
    )
    assert "trn2 and trn3" in found["platform.instance_type"]
    assert "speculation.policy" in found
    found = errors(eagle("vllm-neuron", "model", draft={"tp_degree": 4}))
    assert "Vanilla draft-model" in found["speculation.drafter"] and "draft.tp_degree" in found


def test_a_reduced_vocabulary_head_and_other_taps_point_at_prepare_draft(tmp_path: Path) -> None:
    head = tmp_path / "head"
    head.mkdir()
    config = tiny_head(97, draft_vocab_size=40, taps=(1, 2, 3)).config.to_dict()
    config |= {"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128}
    config |= {"vocab_size": 128256, "draft_vocab_size": 32000}
    (head / "config.json").write_text(json.dumps(config))  # validate reads config.json only
    found = [p for p in validate_config(eagle(draft={"path": str(head)})).errors if p.field == "draft.path"]
    assert len(found) == 2
    assert "prepare-draft" in found[0].fix and "32000 of the target's 128256" in found[0].rule
    assert found[1].value == [1, 2, 3] and "[2, 16, 29]" in found[1].rule


def test_plan_counts_the_head_on_the_targets_cores() -> None:
    plan = plan_deployment(eagle())
    head = plan.models["draft"]
    assert head.architecture.layers == 1 and "shaped like a layer of llama-3.1-8b" in head.architecture.source
    # fc 3H x H, q/k/v over 2H, o, the MLP, 4 norms, embedding and lm_head over the whole vocabulary
    h, v = 4096, 128256
    assert (
        head.architecture.params
        == 3 * h * h + 2 * h * (32 + 16) * 128 + 32 * 128 * h + 3 * h * 14336 + 4 * h + 2 * v * h
    )
    assert head.graphs.total == 0  # compiled inside the target's fused graphs
    assert plan.busiest_core_bytes == plan.models["target"].footprint.bytes_per_core + head.footprint.bytes_per_core


def test_the_docs_table_is_the_codes_table() -> None:
    lines = (Path(__file__).resolve().parents[1] / "docs" / "neuron.md").read_text().splitlines()
    start = lines.index("| library | head | runs | source |")
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    assert rows == [rule.cells() for rule in HEAD_RULES]
