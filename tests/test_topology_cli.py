"""`neuron-ssp validate` and `neuron-ssp plan` through click's CliRunner: exit codes and JSON shapes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from topology_cases import merged, neuron_pair

from neuron_ssp.cli import main

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
TRN1_BF16 = str(CONFIGS / "llama2-70b-7b-trn1-bf16.yaml")
TRN1_FP32 = str(CONFIGS / "llama2-70b-7b-trn1-fp32.yaml")
PROBLEM_KEYS = {"field", "value", "rule", "fix"}


def _write(tmp_path: Path, name: str, data: dict[str, Any]) -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return str(path)


def _run(*args: str) -> Any:
    return CliRunner().invoke(main, list(args), env={"COLUMNS": "200"})


@pytest.fixture
def invalid(tmp_path: Path) -> str:
    return _write(tmp_path, "bad.yaml", merged(neuron_pair(dtype="fp32"), draft={"tp_degree": 16}))


def test_validate_valid_config_exits_0() -> None:
    result = _run("validate", TRN1_BF16)
    assert result.exit_code == 0, result.output
    assert "valid" in result.output and "load order: target -> draft" in result.output


def test_validate_invalid_config_prints_every_problem_and_exits_1(invalid: str) -> None:
    result = _run("validate", invalid)
    assert result.exit_code == 1
    assert "draft.tp_degree" in result.output and "tp_degree must match" in result.output
    assert "Traceback" not in result.output


def test_validate_json_for_one_config(invalid: str) -> None:
    result = _run("validate", "--json", invalid)
    assert result.exit_code == 1
    data = json.loads(result.output)
    assert set(data) == {"valid", "errors", "warnings", "load_order"} and data["valid"] is False
    assert all(set(p) == PROBLEM_KEYS for p in data["errors"])
    assert data["errors"][0]["field"] == "draft.tp_degree" and data["errors"][0]["value"] == 16


def test_validate_json_for_several_configs_maps_paths(invalid: str) -> None:
    result = _run("validate", "--json", TRN1_BF16, invalid)
    assert result.exit_code == 1
    data = json.loads(result.output)
    assert list(data) == [TRN1_BF16, invalid]
    assert data[TRN1_BF16]["valid"] is True and data[invalid]["valid"] is False


def test_validate_all_valid_shipped_configs_exits_0() -> None:
    result = _run("validate", *sorted(str(p) for p in CONFIGS.glob("*.yaml")))
    assert result.exit_code == 0, result.output


def test_validate_reports_schema_and_yaml_problems_as_invalid(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("target: [unclosed\n")
    schema = _write(tmp_path, "schema.yaml", {"target": {"path": "x", "dtype": "fp8", "tp_degrees": 2}})
    result = _run("validate", "--json", str(broken), schema, str(tmp_path / "missing.yaml"))
    assert result.exit_code == 1
    data = json.loads(result.output)
    assert data[str(broken)]["errors"][0]["field"] == "config"
    assert {p["field"] for p in data[schema]["errors"]} == {"target.dtype", "target.tp_degrees"}
    assert data[str(tmp_path / "missing.yaml")]["valid"] is False


def test_plan_trn1_bf16_prints_memory_order_and_cost() -> None:
    result = _run("plan", TRN1_BF16)
    assert result.exit_code == 0, result.output
    for text in (
        "llama-2-70b",
        "10.8",
        "load order: target -> draft",
        "NEURON_RT_VISIBLE_CORES=0-31",
        "$21.50/h",
        "$123.03 per million generated tokens at 20.6 ms/token",
        "fits",
    ):
        assert text in result.output, text


def test_plan_json_shape() -> None:
    result = _run("plan", TRN1_FP32, "--json", "--ms-per-token", "10")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["load_order"] == ["target", "draft"] and data["visible_cores"] == "0-31"
    assert data["fits"] is True and data["fitting_tp_degrees"] == [32]
    assert data["models"]["target"]["cores_needed"] > 18
    assert data["cost_per_million_tokens"] == pytest.approx(21.50 * 10 / 3.6)
    assert data["validation"]["valid"] is True


def test_plan_on_an_instance_where_it_does_not_fit_exits_1() -> None:
    result = _run("plan", TRN1_FP32, "--instance", "inf2.48xlarge", "--json")
    assert result.exit_code == 1
    data = json.loads(result.output)
    assert data["fits"] is False and data["validation"]["valid"] is False


def test_plan_all_instances() -> None:
    result = _run("plan", TRN1_BF16, "--all-instances", "--json")
    assert result.exit_code == 0
    rows = {row["instance"]: row for row in json.loads(result.output)}
    assert rows["trn1.32xlarge"]["recommended_tp"] == 32 and rows["trn1.32xlarge"]["hosts"] == "yes"
    assert rows["trn2.48xlarge"]["hosts"].startswith("no")
    table = _run("plan", TRN1_BF16, "--all-instances")
    assert table.exit_code == 0 and "inf2.48xlarge" in table.output


def test_plan_without_instance_is_a_usage_error() -> None:
    result = _run("plan", str(CONFIGS / "default.yaml"))
    assert result.exit_code == 2
    assert "platform.instance_type" in result.output


def test_plan_rejects_a_non_positive_latency() -> None:
    assert _run("plan", TRN1_BF16, "--ms-per-token", "0").exit_code == 2
