"""`neuron-ssp doctor` and `neuron-ssp compile` from the command line."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest
import yaml
from click.testing import CliRunner
from neuron_support import neuron_config

from neuron_ssp.cli import main
from neuron_ssp.cli.neuron import parse_ks
from neuron_ssp.errors import UsageError

REPO_CONFIGS = Path(__file__).resolve().parents[1] / "configs"

pytest_plugins = ["neuron_fixtures"]  # fixtures: neuronx, neuronx_any, tiny_model_dirs


@pytest.fixture
def no_neuron_here(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """This machine as it is (no device, no neuron-ls), whatever the CI runner has."""
    monkeypatch.setattr("neuron_ssp.backends.neuron.env.DEV_GLOB", str(tmp_path / "none" / "neuron*"))
    monkeypatch.setattr("neuron_ssp.backends.neuron.env.NEURON_LS_FALLBACK", str(tmp_path / "none" / "neuron-ls"))
    monkeypatch.setattr("neuron_ssp.backends.neuron.env.SYSFS_INSTANCE_TYPE", str(tmp_path / "none" / "instance_type"))
    monkeypatch.setenv("PATH", str(tmp_path / "none"))


def test_doctor_says_no_neuron_device_and_what_still_works(no_neuron_here: None) -> None:
    result = CliRunner().invoke(main, ["doctor", "--configs", str(REPO_CONFIGS)])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "No Neuron device on this machine" in text
    assert "Still works here:" in text and "torch reference backend" in text
    assert all(name in text for name in ("generate", "validate", "plan"))
    assert "Needs an inf2/trn1/trn2 instance: compile, and any config with platform.backend: neuron" in text
    assert "transformers-neuronx does not import" in text and "pip.repos.neuron.amazonaws.com" in text


def test_doctor_json_checks_configs_against_a_given_instance(no_neuron_here: None) -> None:
    result = CliRunner().invoke(
        main, ["doctor", "--instance", "inf2.48xlarge", "--configs", str(REPO_CONFIGS), "--json"]
    )
    report = json.loads(result.output)
    assert report["neuron_device_present"] is False and report["instance_type"] == "inf2.48xlarge"
    assert "compile" not in report["works_here"] and "generate" in report["works_here"]
    status = {Path(row["config"]).name: row["status"] for row in report["configs"]}
    assert status["default.yaml"] == "runs here"
    neuron_rows = [s for name, s in status.items() if name != "default.yaml"]
    made_for = {"made for trn1.32xlarge", "made for trn2.48xlarge"}
    assert neuron_rows and set(neuron_rows) <= {"fits", "not valid here", *made_for}
    if "llama2-70b-7b-inf2-bf16.yaml" in status:
        assert status["llama2-70b-7b-inf2-bf16.yaml"] == "fits"


def test_doctor_says_an_inf2_config_is_made_for_inf2_not_how_to_rewrite_it(no_neuron_here: None) -> None:
    """Today's code says 'not valid here ... Fix: use 16 or 32': trn1 tp values for an inf2 config."""
    result = CliRunner().invoke(
        main, ["doctor", "--instance", "trn1.32xlarge", "--configs", str(REPO_CONFIGS), "--json"]
    )
    rows = {Path(row["config"]).name: row for row in json.loads(result.output)["configs"]}
    inf2 = rows["llama2-70b-7b-inf2-bf16.yaml"]
    assert inf2["status"] == "made for inf2.48xlarge"
    assert "this is trn1.32xlarge" in inf2["detail"] and "use llama2-70b-7b-trn1-bf16.yaml" in inf2["detail"]
    assert "16 or 32" not in inf2["detail"]


def test_doctor_prints_the_install_command_on_one_line(no_neuron_here: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """At 80 columns today's output breaks 'pip' / 'install ...' over two lines."""
    monkeypatch.setenv("COLUMNS", "80")
    result = CliRunner().invoke(main, ["doctor", "--configs", str(REPO_CONFIGS)])
    command = "pip install transformers-neuronx --extra-index-url=https://pip.repos.neuron.amazonaws.com"
    assert any(command in line for line in result.output.splitlines()), result.output


def test_doctor_reads_the_core_count_from_neuron_ls(
    no_neuron_here: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tool = tmp_path / "bin" / "neuron-ls"
    tool.parent.mkdir()
    devices = [{"neuron_device": i, "nc_count": 2, "memory_size": 34359738368} for i in range(12)]
    tool.write_text(f"#!/bin/sh\necho '{json.dumps(devices)}'\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", str(tool.parent))
    report = json.loads(CliRunner().invoke(main, ["doctor", "--configs", str(tmp_path), "--json"]).output)
    assert report["neuron_cores"] == 24 and report["instance_type"] == "inf2.48xlarge"
    assert report["neuron_device_present"] is True


def test_compile_without_transformers_neuronx_exits_1_with_the_install_command(
    tiny_model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    config = _write_config(tmp_path, tiny_model_dirs)
    result = CliRunner().invoke(main, ["compile", str(config), "--k", "2..3", "--out", str(tmp_path / "out")])
    assert result.exit_code == 1
    assert "pip.repos.neuron.amazonaws.com" in " ".join(result.output.split())


def test_compile_prints_the_time_per_k(neuronx: ModuleType, tiny_model_dirs: dict[str, Path], tmp_path: Path) -> None:
    config = _write_config(tmp_path, tiny_model_dirs)
    out = tmp_path / "compiled"
    result = CliRunner().invoke(main, ["compile", str(config), "--k", "2,4", "--out", str(out)])
    assert result.exit_code == 0, result.output
    for label in (
        "target k=2,4: compiled in",  # one target holds both windows
        "draft (no speculation): compiled in",
    ):
        assert label in result.output
    again = CliRunner().invoke(main, ["compile", str(config), "--k", "2,4", "--out", str(out), "--json"])
    assert all(row["reused"] for row in json.loads(again.output[again.output.index("{\n") :])["results"])


def test_doctor_self_test_passes_and_catches_the_0623de2_capping(
    neuronx: ModuleType, tiny_model_dirs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from neuron_support import reimport_standin

    config = _write_config(tmp_path, tiny_model_dirs)
    passed = CliRunner().invoke(main, ["doctor", "--self-test", str(config), "--json"])
    assert passed.exit_code == 0, passed.output
    report = json.loads(passed.output[passed.output.index("{\n") :])
    before, past = report["regions"]
    assert report["passed"] and before["argmax_agreement"] == past["argmax_agreement"] == 1.0
    assert past["name"] == "from slot 64" and past["positions"] >= 32 and past["mean_kl"] == 0.0
    reimport_standin(monkeypatch, NEURONX_STANDIN_COMMIT="0623de2")
    failed = CliRunner().invoke(main, ["doctor", "--self-test", str(config)])
    assert failed.exit_code != 0
    assert "FAILED" in failed.output and "differs" in failed.output  # the per-position table
    assert "neuron.self_test" in failed.output and "0623de2" in " ".join(failed.output.split())


def _write_config(tmp_path: Path, tiny_model_dirs: dict[str, Path]) -> Path:
    config = neuron_config(tiny_model_dirs["target"], tiny_model_dirs["draft"])
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    return path


@pytest.mark.parametrize(("text", "ks"), [(None, [4]), ("6", [6]), ("2..5", [2, 3, 4, 5]), ("8, 2,4,2", [2, 4, 8])])
def test_parse_ks(text: str | None, ks: list[int]) -> None:
    assert parse_ks(text, 4) == ks


@pytest.mark.parametrize("text", ["1..4", "two", "4-8", ""])
def test_parse_ks_refuses(text: str) -> None:
    with pytest.raises(UsageError):
        parse_ks(text, 4)


def test_doctor_self_test_of_a_static_batch_config_says_which_build_it_checks(
    neuronx: ModuleType, tiny_model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    config = neuron_config(
        tiny_model_dirs["target"],
        tiny_model_dirs["draft"],
        speculation={"engine": "library"},
        target={"batch_size": 2},
        draft={"batch_size": 2},
    )
    path = tmp_path / "batch2.yaml"
    path.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    result = CliRunner().invoke(main, ["doctor", "--self-test", str(path)])
    assert result.exit_code == 0, result.output
    assert "not the static-batch build the engine loads" in " ".join(result.output.split())
