"""Batch > 1 on Neuron (topology/batch_rules.py): one table of what each library, engine and version can do with many
sequences, held against docs/neuron.md, and `validate` refusing each combination it says no to, with its source."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from topology_cases import LLAMA3_8B, LLAMA3_70B, merged, neuron_pair

from neuron_ssp.cli import main
from neuron_ssp.config import config_from_dict, load_config
from neuron_ssp.errors import Problem
from neuron_ssp.topology import validate_config
from neuron_ssp.topology.batch_rules import (
    BATCH_RULES,
    GENERATIONS,
    TNX_0_10,
    TNX_0_10_BATCH_SIZES,
    TNX_0_11,
    TNX_0_13,
    TNX_DEFAULT,
    NeuronxBehaviour,
    generation_for_version,
    rule_for,
)

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "neuron.md"
TNX_BATCH4 = ROOT / "configs" / "llama3-70b-8b-trn1-x4-bf16.yaml"
NXDI_BATCH4 = ROOT / "configs" / "nxdi-llama33-70b-trn2-fused-batch4.yaml"
TABLE_HEADER = "| library | engine | version | batch > 1 | continuous batching | sampling |"
FILE_LINE = re.compile(r"\.(py|rst|md):\d+")


def batch4(**sections: dict[str, Any]) -> dict[str, Any]:
    """Llama-3-70B + 8B on trn1.32xlarge at batch 4, with `sections` merged in."""
    data = merged(neuron_pair(target=LLAMA3_70B, draft=LLAMA3_8B), target={"batch_size": 4}, draft={"batch_size": 4})
    return merged(data, **sections)


def report(data: dict[str, Any], generation: str = TNX_DEFAULT) -> tuple[list[Problem], list[Problem]]:
    result = validate_config(config_from_dict(data), neuronx_generation=generation)
    return result.errors, result.warnings


def fields(problems: list[Problem]) -> set[str]:
    return {p.field for p in problems}


def docs_rows() -> list[list[str]]:
    lines = DOCS.read_text().splitlines()
    start = lines.index(TABLE_HEADER)
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def test_the_docs_table_is_the_codes_table() -> None:
    assert docs_rows() == [rule.cells() for rule in BATCH_RULES]


def test_every_row_names_where_its_batch_and_sampling_answers_were_read() -> None:
    for rule in BATCH_RULES:
        assert FILE_LINE.search(rule.batch_source), rule
        on_the_host = rule.sampling and "our acceptor" in rule.sampling_source
        assert on_the_host or FILE_LINE.search(rule.sampling_source), rule
        assert rule.continuous is False or FILE_LINE.search(rule.continuous_source), rule
    assert len({(r.library, r.engine, r.generation) for r in BATCH_RULES}) == len(BATCH_RULES)


@pytest.mark.parametrize(
    ("version", "generation"),
    [
        ("0.13.322.0", TNX_0_13),
        ("0.13", TNX_0_13),
        ("0.12.313", TNX_0_11),
        ("0.11.351", TNX_0_11),
        ("0.10.0.21", TNX_0_10),
        ("unknown", TNX_0_10),
    ],
)
def test_a_version_string_maps_to_the_commit_whose_rules_apply(version: str, generation: str) -> None:
    assert generation_for_version(version) == generation


@pytest.mark.parametrize(
    ("behaviour", "generation"),
    [
        (NeuronxBehaviour("0.10.0.21", False, True, "not checked", False), TNX_0_10),
        (NeuronxBehaviour("0.10.0.360", True, True, "cache_ids [[0, 1, 2, 3]]", False), TNX_0_10_BATCH_SIZES),
        (NeuronxBehaviour("0.11.351", True, True, None, False), TNX_0_11),
        (NeuronxBehaviour("0.13.322", True, True, None, True), TNX_0_13),
        (NeuronxBehaviour("0.13.322", True, True, "cache_ids [[0, 1, 2, 3]]", True), TNX_0_10_BATCH_SIZES),
    ],
)
def test_an_installed_build_is_known_by_what_it_does(behaviour: NeuronxBehaviour, generation: str) -> None:
    """The version is only reported: a build that calls itself 0.13 but rewrites a window's cache ids is refused as
    0623de2 is."""
    assert behaviour.generation == generation
    assert behaviour.version in behaviour.describe() and GENERATIONS[generation] in behaviour.describe()


@pytest.mark.parametrize("engine", ["native", "library", "fused"])
def test_transformers_neuronx_013_runs_every_engine_at_batch_4(engine: str) -> None:
    errors, _ = report(batch4(speculation={"engine": engine}))
    assert not fields(errors) & {"target.batch_size", "draft.batch_size", "speculation.engine"}, errors


def test_transformers_neuronx_011_runs_our_loop_at_batch_4_not_the_librarys() -> None:
    """c8d6bdc has the continuous-batching window branch our loop needs (base.py:355-378) but its
    SpeculativeGenerator raises for batch > 1 (speculation.py:346-347)."""
    assert not fields(report(batch4(), TNX_0_11)[0]) & {"target.batch_size", "draft.batch_size"}
    refused = [p for p in report(batch4(speculation={"engine": "library"}), TNX_0_11)[0] if "batch_size" in p.field]
    assert fields(refused) == {"target.batch_size", "draft.batch_size"}
    assert all("speculation.py:346-347" in p.rule and "transformers-neuronx 0.13" in p.fix for p in refused)


@pytest.mark.parametrize("generation", [TNX_0_10, TNX_0_10_BATCH_SIZES])
@pytest.mark.parametrize("engine", ["native", "library"])
def test_transformers_neuronx_010_refuses_batch_4_naming_why(engine: str, generation: str) -> None:
    errors, _ = report(batch4(speculation={"engine": engine}), generation)
    refused = [p for p in errors if p.field.endswith("batch_size")]
    assert fields(refused) == {"target.batch_size", "draft.batch_size"}
    why = {
        ("native", TNX_0_10): "no batch_sizes=, base.py:76 at 7a30b42",
        ("native", TNX_0_10_BATCH_SIZES): "base.py:291-295 at 0623de2",
    }.get((engine, generation), "speculation.py:346-347")
    first_with_batches = "0.11-0.12" if engine == "native" else "0.13"
    for problem in refused:
        assert problem.value == 4 and why in problem.rule, problem.rule
        assert "batch_size: 1" in problem.fix and f"transformers-neuronx {first_with_batches}" in problem.fix
    _, warnings = report(batch4(speculation={"engine": engine}, serve={"max_batch": 4}), generation)
    assert "serve.max_batch" not in fields(warnings)  # said once, by the batch_size errors


@pytest.mark.parametrize("generation", [TNX_0_10, TNX_0_10_BATCH_SIZES, TNX_0_11])
def test_fused_before_013_does_not_exist(generation: str) -> None:
    errors, _ = report(batch4(speculation={"engine": "fused"}), generation)
    (engine,) = [p for p in errors if p.field == "speculation.engine"]
    assert "1ade6d7" in engine.rule and "engine: native" in engine.fix
    assert rule_for("transformers-neuronx", "fused", generation) is None


def test_nxdi_native_is_batch_1_and_points_to_fused_greedy() -> None:
    errors, _ = report(batch4(neuron={"library": "nxdi"}))
    refused = [p for p in errors if p.field.endswith("batch_size")]
    assert fields(refused) == {"target.batch_size", "draft.batch_size"}
    assert all("feature-guide.rst:516" in p.rule for p in refused)
    assert "speculation.engine: fused (greedy only)" in refused[0].fix


def test_nxdi_fused_takes_batch_4_greedily_and_refuses_a_temperature() -> None:
    fused = {"library": "nxdi"}
    greedy = batch4(neuron=fused, speculation={"engine": "fused", "acceptor": "greedy"})
    assert not fields(report(greedy)[0]) & {"target.batch_size", "draft.batch_size", "sampling.temperature"}
    sampled = merged(greedy, speculation={"acceptor": "probabilistic"}, sampling={"temperature": 0.7})
    (temperature,) = [p for p in report(sampled)[0] if p.field == "sampling.temperature"]
    assert temperature.value == 0.7 and "model_base.py:1162" in temperature.rule
    assert "temperature: 0" in temperature.fix and "speculation.engine: native" in temperature.fix


def test_the_draft_runs_the_targets_batch() -> None:
    errors, _ = report(batch4(draft={"batch_size": 2}))
    (draft,) = [p for p in errors if p.field == "draft.batch_size"]
    assert draft.value == 2 and draft.fix == "set draft.batch_size: 4, like the target"


def test_serve_max_batch_above_the_compiled_batch_is_refused() -> None:
    errors, _ = report(batch4(serve={"max_batch": 6}))
    (serve,) = [p for p in errors if p.field == "serve.max_batch"]
    assert serve.value == 6 and "compiled for batch 4" in serve.rule
    assert "lower serve.max_batch to 4" in serve.fix and "compile a larger batch" in serve.fix
    assert not report(batch4(serve={"max_batch": 4}))[0]
    assert not fields(report(neuron_pair())[0])  # the default 8 is the torch backend's: not checked


def test_a_running_batch_the_engine_cannot_join_is_a_warning() -> None:
    errors, warnings = report(batch4(speculation={"engine": "library"}, serve={"max_batch": 4}))
    assert "serve.max_batch" not in fields(errors)
    (serve,) = [p for p in warnings if p.field == "serve.max_batch"]
    assert "speculation.py:778-786" in serve.rule and "speculation.engine: native" in serve.fix


def test_every_batch_problem_is_reported_at_once() -> None:
    data = batch4(
        neuron={"library": "nxdi"}, sampling={"temperature": 0.5}, serve={"max_batch": 16}, draft={"batch_size": 2}
    )
    assert {"target.batch_size", "draft.batch_size", "serve.max_batch"} <= fields(report(data)[0])
    nxdi_fused = merged(data, speculation={"engine": "fused"})
    assert {"draft.batch_size", "sampling.temperature", "serve.max_batch"} <= fields(report(nxdi_fused)[0])


@pytest.mark.parametrize("path", [TNX_BATCH4, NXDI_BATCH4], ids=lambda p: p.stem)
def test_the_batch_configs_are_valid_at_batch_above_1(path: Path) -> None:
    config = load_config(path)
    assert config.target.batch_size > 1 and config.draft is not None
    assert config.draft.batch_size == config.target.batch_size == config.serve.max_batch
    assert validate_config(config).ok


def test_validate_plans_for_the_version_it_is_given() -> None:
    runner = CliRunner()
    assert runner.invoke(main, ["validate", str(TNX_BATCH4)]).exit_code == 0
    assert runner.invoke(main, ["validate", str(TNX_BATCH4), "--neuronx-version", "0.12"]).exit_code == 0
    result = runner.invoke(main, ["validate", str(TNX_BATCH4), "--neuronx-version", "0.10", "--json"])
    assert result.exit_code == 1
    assert {p["field"] for p in json.loads(result.output)["errors"]} == {"target.batch_size", "draft.batch_size"}


def test_generation_names_cover_every_row() -> None:
    assert {rule.generation for rule in BATCH_RULES} == set(GENERATIONS)


@pytest.mark.parametrize("batch", [1, 4])
def test_nxdi_fused_samples_only_the_last_position_with_or_without_continuous_batching(batch: int) -> None:
    """model_base.py:1162-1183 at 4bcdc54b: with do_sample the target's on-device sampler takes logits[:, -1, :],
    whatever the batch (continuous batching is only on above batch 1); validate and a sampled request at join say
    the same."""
    from neuron_ssp.engines.nxdi_fused import refuse_sampled
    from neuron_ssp.errors import UsageError
    from neuron_ssp.speculation.sampling import SamplingParams

    data = merged(
        neuron_pair(target=LLAMA3_70B, draft=LLAMA3_8B),
        target={"batch_size": batch},
        draft={"batch_size": batch},
        neuron={"library": "nxdi"},
        speculation={"engine": "fused", "acceptor": "probabilistic"},
        sampling={"temperature": 0.7},
    )
    (validated,) = [p for p in report(data)[0] if p.field == "sampling.temperature"]
    with pytest.raises(UsageError) as joined:
        refuse_sampled(SamplingParams(temperature=0.7))
    for rule in (validated.rule, joined.value.problems[0].rule):
        assert "logits[:, -1, :]" in rule and "model_base.py:1162-1183" in rule, rule
        assert "whether or not continuous batching is on" in rule, rule


def test_engine_library_samples_with_our_acceptor_per_row_not_the_librarys_default() -> None:
    """Our engine plugs its own acceptor into SpeculativeGenerator and calls it one row at a time (engines/library.py
    LibraryLanes): the library's DefaultTokenAcceptor, which mixes rows up at batch > 1 (speculation.py:247-249 at
    1ade6d7), is never credited with a batch."""
    for rule in BATCH_RULES:
        if rule.engine == "library":
            assert "our acceptor" in rule.sampling_source and "DefaultTokenAcceptor per row" not in rule.sampling_source
    (batched,) = [r for r in BATCH_RULES if r.engine == "library" and r.batch]
    assert "speculation.py:247" in batched.sampling_source and ":248-249" in batched.sampling_source
