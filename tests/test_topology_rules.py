"""A table of valid and invalid configs: every topology rule fires, naming the right field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from topology_cases import LLAMA2_7B, LLAMA3_70B, merged, neuron_pair, problems

from neuron_ssp.config import EMBEDDED_DEFAULT, config_from_dict, load_config
from neuron_ssp.errors import UsageError
from neuron_ssp.topology import validate_config

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
TRN1 = neuron_pair()
ONLY_TARGET = {"speculation": {"drafter": "ngram"}}


def _llama_dir(tmp_path: Any, text: str) -> str:
    model_dir = tmp_path / "my-finetune"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(text)
    return str(model_dir)


LLAMA2_7B_CONFIG_JSON = json.dumps(
    {
        "num_hidden_layers": 32,
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "vocab_size": 32000,
        "intermediate_size": 11008,
        "tie_word_embeddings": False,
    }
)

# (id, config dict, error fields, warning fields); fields compared as sets.
CASES: list[tuple[str, dict[str, Any], set[str], set[str]]] = [
    # ---- valid
    ("embedded-default-torch", {}, set(), set()),
    ("trn1-bf16-70b-7b-tp32", TRN1, set(), set()),
    ("trn1-fp32-70b-7b-tp32", neuron_pair(dtype="fp32"), set(), set()),
    ("trn1-bf16-tp16-is-enough", neuron_pair(tp=16), set(), set()),
    ("trn1n-bf16", neuron_pair(instance="trn1n.32xlarge"), set(), set()),
    (
        "inf2-bf16-tp24-pads-heads",
        neuron_pair(instance="inf2.48xlarge", tp=24),
        set(),
        {"target.tp_degree", "draft.tp_degree"},
    ),
    (
        "inf2-tp16-untested",
        neuron_pair(instance="inf2.48xlarge", tp=16),
        set(),
        {"target.tp_degree", "draft.tp_degree"},
    ),
    ("llama3-trn1-bf16", neuron_pair(target=LLAMA3_70B, draft="/opt/models/Meta-Llama-3-8B-Instruct"), set(), set()),
    (
        "upper-half-of-trn1",
        merged(neuron_pair(tp=16), target={"first_core": 16}, draft={"first_core": 16}),
        set(),
        set(),
    ),
    (
        "ngram-draft-ignores-draft-section",
        merged(neuron_pair(instance="trn1.2xlarge", tp=2, target=LLAMA2_7B), **ONLY_TARGET),
        set(),
        set(),
    ),
    (
        "architecture-hint",
        merged(TRN1, target={"path": "/opt/models/prod", "architecture": "llama-2-70b"}),
        set(),
        set(),
    ),
    (
        "torch-skips-hardware-rules",
        merged(
            TRN1, platform={"backend": "torch", "instance_type": None}, target={"tp_degree": 3}, draft={"tp_degree": 5}
        ),
        set(),
        set(),
    ),
    ("torch-unknown-local-model", {"target": {"path": "/nowhere/tiny-model"}}, set(), set()),
    # ---- invalid: instance
    ("neuron-needs-instance", merged(TRN1, platform={"instance_type": None}), {"platform.instance_type"}, set()),
    ("unknown-instance", merged(TRN1, platform={"instance_type": "trn1.32xl"}), {"platform.instance_type"}, set()),
    (
        "trn2-not-transformers-neuronx",
        merged(TRN1, platform={"instance_type": "trn2.48xlarge"}),
        {"platform.instance_type"},
        set(),
    ),
    # ---- invalid: tp degree
    ("trn1-tp4-not-allowed", merged(neuron_pair(tp=4, target=LLAMA2_7B), **ONLY_TARGET), {"target.tp_degree"}, set()),
    (
        "inf2-odd-tp",
        merged(neuron_pair(instance="inf2.48xlarge", tp=3, target=LLAMA2_7B), **ONLY_TARGET),
        {"target.tp_degree"},
        set(),
    ),
    ("tp-above-instance-cores", neuron_pair(tp=64), {"target.tp_degree", "draft.tp_degree"}, set()),
    # ---- invalid: placement
    (
        "fp32-draft-on-fewer-cores",
        merged(neuron_pair(dtype="fp32"), draft={"tp_degree": 16}),
        {"draft.tp_degree"},
        set(),
    ),
    ("partial-overlap", merged(neuron_pair(tp=16), draft={"first_core": 8}), {"draft.first_core"}, set()),
    ("disjoint-needs-two-processes", merged(neuron_pair(tp=16), draft={"first_core": 16}), {"draft.first_core"}, set()),
    (
        "cores-past-instance",
        merged(TRN1, target={"first_core": 8}, draft={"first_core": 8}),
        {"target.first_core", "draft.first_core"},
        set(),
    ),
    # ---- invalid: memory
    ("fp32-70b-on-16-cores", neuron_pair(dtype="fp32", tp=16), {"target.tp_degree"}, set()),
    (
        "fp32-on-inf2-fits-nowhere",
        neuron_pair(instance="inf2.48xlarge", dtype="fp32", tp=24),
        {"target.tp_degree"},
        {"target.tp_degree", "draft.tp_degree"},
    ),
    (
        "shared-cores-overflow",
        merged(neuron_pair(tp=16), target={"n_positions": 65536}, draft={"n_positions": 65536}),
        {"target.tp_degree"},
        set(),
    ),
    # ---- invalid: batch, positions, window, vocabulary
    ("batch-2-target-only", merged(TRN1, target={"batch_size": 2}), {"draft.batch_size"}, set()),
    (
        "batch-2-on-nxdi-native",
        merged(TRN1, neuron={"library": "nxdi"}, target={"batch_size": 2}, draft={"batch_size": 2}),
        {"target.batch_size", "draft.batch_size"},
        {"neuron.library"},
    ),
    (
        "positions-too-few",
        merged(TRN1, generation={"max_prompt_tokens": 2000}),
        {"target.n_positions", "draft.n_positions"},
        set(),
    ),
    (
        "draft-positions-below-k",
        {
            "target": {"path": EMBEDDED_DEFAULT},
            "draft": {"path": EMBEDDED_DEFAULT, "n_positions": 16},
            "speculation": {"drafter": "model", "k": 32},
        },
        {"speculation.k", "draft.n_positions"},
        set(),
    ),
    ("vocabulary-mismatch", neuron_pair(target=LLAMA3_70B, draft=LLAMA2_7B), {"draft.path"}, set()),
    (
        "vocabulary-mismatch-on-torch",
        {
            "target": {"path": EMBEDDED_DEFAULT},
            "draft": {"path": "/opt/models/Llama-2-7b-hf"},
            "speculation": {"drafter": "model"},
        },
        {"draft.path"},
        set(),
    ),
    # ---- invalid: architecture, schema
    ("unknown-architecture-on-neuron", merged(TRN1, target={"path": "/opt/models/prod-model"}), {"target.path"}, set()),
    (
        "bad-architecture-hint",
        {"target": {"path": EMBEDDED_DEFAULT, "architecture": "llama-9-1b"}},
        {"target.architecture"},
        set(),
    ),
    ("dtype-fp8", merged(TRN1, target={"dtype": "fp8"}), {"target.dtype"}, set()),
    ("k-below-2", merged(TRN1, speculation={"k": 1}), {"speculation.k"}, set()),
]


@pytest.mark.parametrize(("data", "errors", "warnings"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_rule_table(data: dict[str, Any], errors: set[str], warnings: set[str]) -> None:
    found_errors, found_warnings = problems(data)
    assert {p.field for p in found_errors} == errors, [str(p) for p in found_errors]
    assert {p.field for p in found_warnings} == warnings, [str(p) for p in found_warnings]
    for p in found_errors + found_warnings:
        assert p.rule and p.fix


def test_blog_fp32_fix_names_the_targets_tp() -> None:
    errors, _ = problems(merged(neuron_pair(dtype="fp32"), draft={"tp_degree": 16}))
    assert errors[0].fix == "set the draft's tp_degree to 32, like the target"


def test_memory_fix_names_the_smallest_tp_that_fits() -> None:
    errors, _ = problems(neuron_pair(dtype="fp32", tp=16))
    assert "set tp_degree to 32 for target and draft" in errors[0].fix
    assert "GiB" in errors[0].rule


def test_fits_nowhere_points_to_other_instances() -> None:
    errors, _ = problems(neuron_pair(instance="inf2.48xlarge", dtype="fp32", tp=24))
    assert "--all-instances" in errors[0].fix


def test_trn2_points_to_nxd_inference() -> None:
    errors, _ = problems(merged(TRN1, platform={"instance_type": "trn2.48xlarge"}))
    assert "NxD Inference" in errors[0].fix


def test_unknown_instance_suggests_the_near_name() -> None:
    errors, _ = problems(merged(TRN1, platform={"instance_type": "trn1.32xl"}))
    assert "trn1.32xlarge" in errors[0].fix


def test_disallowed_tp_suggests_neighbours() -> None:
    errors, _ = problems(merged(neuron_pair(tp=4, target=LLAMA2_7B), **ONLY_TARGET))
    assert errors[0].fix == "use 2 or 8"


def test_every_problem_is_reported_at_once() -> None:
    data = merged(
        neuron_pair(dtype="fp32", tp=16),
        target={"batch_size": 2},
        draft={"tp_degree": 8, "path": "/opt/models/Meta-Llama-3-8B"},
        generation={"max_prompt_tokens": 4000},
    )
    errors, _ = problems(data)
    assert {
        "draft.batch_size",
        "draft.tp_degree",
        "draft.path",
        "target.n_positions",
        "draft.n_positions",
        "target.tp_degree",
    } <= {p.field for p in errors}
    draft_tp = next(p for p in errors if p.field == "draft.tp_degree")
    assert "once the target's is fixed" in draft_tp.fix  # the target's 16 is itself wrong in fp32


def test_config_json_is_read_when_the_directory_exists(tmp_path: Any) -> None:
    path = _llama_dir(tmp_path, LLAMA2_7B_CONFIG_JSON)
    errors, _ = problems(merged(neuron_pair(instance="trn1.2xlarge", tp=2), target={"path": path}, **ONLY_TARGET))
    assert errors == []


def test_broken_config_json_names_the_model(tmp_path: Any) -> None:
    path = _llama_dir(tmp_path, "{not json")
    errors, _ = problems(merged(TRN1, target={"path": path}))
    assert [p.field for p in errors] == ["target.path"]
    assert "architecture:" in errors[0].fix


def test_k_checked_again_after_the_config_changed() -> None:
    config = load_config()
    config.target.n_positions = 16
    config.speculation.k = 17
    assert [p.field for p in validate_config(config).errors] == ["speculation.k", "target.n_positions"]


def test_load_order_and_raise_if_invalid() -> None:
    report = validate_config(config_from_dict(TRN1))
    assert report.ok and report.load_order == ["target", "draft"]
    report.raise_if_invalid()
    bad = validate_config(config_from_dict(merged(TRN1, target={"batch_size": 2})))
    with pytest.raises(UsageError) as caught:
        bad.raise_if_invalid()
    assert caught.value.problems == bad.errors


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_configs_are_valid(path: Path) -> None:
    report = validate_config(load_config(path))
    assert report.ok, [str(p) for p in report.errors]
    assert path.read_text().startswith("#"), "each config starts with a comment saying what it is for"
