"""`neuron-ssp compile` and `doctor --self-test` on an NxDI config, through the real NxDI code (CPU mode),
and what `doctor` says about NxD Inference (the last part runs in every venv)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from nxdi_support.configs import nxdi_config

from neuron_ssp.backends.nxdi.env import probe_nxdi, sdk_of
from neuron_ssp.cli import main

pytest_plugins = ["neuron_fixtures", "nxdi_fixtures"]  # tiny_model_dirs; nxdi


def write(config: Any, path: Path) -> Path:
    path.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    return path


def test_compile_keeps_the_draft_once_and_the_target_per_k(nxdi: Any, tiny_model_dirs, tmp_path) -> None:
    config = nxdi_config(tiny_model_dirs["target"], tiny_model_dirs["draft"], neuron={"self_test": False})
    path = write(config, tmp_path / "nxdi.yaml")
    out = tmp_path / "compiled"
    result = CliRunner().invoke(main, ["compile", str(path), "--k", "3,4", "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output[result.output.index("{\n") :])
    rows = report["results"]
    assert report["estimate"] is None  # transformers-neuronx's bucket estimate does not apply to NxDI
    # one context-encoding bucket (128 positions) and one decoding graph each (topology/nxdi_graphs.py)
    assert report["graphs"] == {"target k=3": 2, "target k=4": 2, "draft (no speculation)": 2}
    assert [(r["role"], r["k"], r["reused"]) for r in rows] == [
        ("target", [3], False),
        ("target", [4], False),
        ("draft", None, False),
    ]
    again = CliRunner().invoke(main, ["compile", str(path), "--k", "3,4", "--out", str(out), "--json"])
    assert all(r["reused"] for r in json.loads(again.output[again.output.index("{\n") :])["results"])
    compiles = [name for name, call, _ in nxdi.DEVICE_CALLS if call == "compile"]
    assert compiles == ["tiny-target", "tiny-target", "tiny-draft"]  # nothing compiled the second time


def test_doctor_self_test_on_nxdi(nxdi: Any, tiny_model_dirs, tmp_path) -> None:
    path = write(nxdi_config(tiny_model_dirs["target"]), tmp_path / "nxdi.yaml")
    result = CliRunner().invoke(main, ["doctor", "--self-test", str(path)], env={"COLUMNS": "100"})
    assert result.exit_code == 0, result.output
    assert "self-test, neuronx-distributed-inference 0.9" in result.output and "passed" in result.output
    assert "from slot 64: 36 positions, argmax agreement 100%" in " ".join(result.output.split())


def test_doctor_reports_nxdi_its_sdk_and_dlami_venvs(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    venv = tmp_path / "opt" / "aws_neuronx_venv_pytorch_2_9_nxd_inference"
    venv.mkdir(parents=True)
    monkeypatch.setattr(
        "neuron_ssp.backends.nxdi.env.NXDI_VENV_GLOB",
        str(tmp_path / "opt" / "aws_neuronx_venv_pytorch_*_nxd_inference"),
    )
    result = CliRunner().invoke(main, ["doctor", "--json", "--configs", str(tmp_path)])
    report = json.loads(result.output)["nxdi"]
    assert report["dlami_venvs"] == [str(venv)]
    installed = probe_nxdi().version
    assert report["version"] == installed and report["usable"] == (installed is not None and report["usable"])
    if installed is None:
        assert "neuronx-distributed-inference is not installed" in report["problem"]
    text = CliRunner().invoke(main, ["doctor", "--configs", str(tmp_path)], env={"COLUMNS": "200"}).output
    assert f"DLAMI NxD Inference venv here: {venv}" in text


@pytest.mark.parametrize(
    ("version", "sdk", "trn1_inf2"),
    [
        ("0.8.16251", "2.28", True),
        ("0.9.17334", "2.29", False),
        ("0.9.0+src", "2.29", False),
        ("0.10.18399", "2.31", False),
        ("0.7.14366", None, None),
    ],
)
def test_sdk_of_each_nxdi_release(version: str, sdk: str | None, trn1_inf2: bool | None) -> None:
    from neuron_ssp.backends.nxdi.env import NxdiInstall

    assert sdk_of(version) == sdk
    assert NxdiInstall(version, sdk, []).runs_trn1_inf2 is trn1_inf2
