"""Installing neuron-ssp into a Neuron venv keeps that venv's own builds: the EC2
bootstrap and the SageMaker Dockerfile pin the same set of packages, the one `neuron-ssp doctor` reports."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from neuron_ssp.backends.neuron.env import NEURON_STACK, stack_warning

ROOT = Path(__file__).resolve().parents[1]
PINNING_FILES = [ROOT / "neuron_ssp" / "data" / "deploy-bootstrap.sh", ROOT / "deploy" / "sagemaker" / "Dockerfile"]
FREEZE = [  # pip freeze of a Neuron venv, with both spellings pip may print
    "torch==2.7.0",
    "torch-neuronx==2.7.0.2.9.9357",
    "torch_xla==2.7.0",
    "transformers==4.48.3",
    "transformers-neuronx==0.13.1216",
    "neuronx-cc==2.20.9961.0",
    "libneuronxla==2.2.4410.0",
    "numpy==1.26.4",
    "neuronx_distributed==0.14.0",
    "neuronx-distributed-inference==0.6.0",
    "torchvision==0.22.0",
    "accelerate==1.6.0",
    "neuronx-distributed-training==1.5.0",
]


def pin_pattern(path: Path) -> str:
    (pattern,) = re.findall(r"grep -iE '([^']+)'", path.read_text())
    return pattern


@pytest.mark.parametrize("path", PINNING_FILES, ids=lambda p: p.name)
def test_the_constraints_are_exactly_the_neuron_stack(path: Path) -> None:
    done = subprocess.run(
        ["grep", "-iE", pin_pattern(path)], input="\n".join(FREEZE) + "\n", text=True, capture_output=True, check=False
    )
    pinned = {line.split("==")[0].lower().replace("_", "-") for line in done.stdout.split()}
    assert pinned == set(NEURON_STACK)


def test_doctor_reports_every_version_of_the_stack(monkeypatch: pytest.MonkeyPatch) -> None:
    from neuron_ssp.cli.neuron import doctor_report

    report = doctor_report(None, ROOT / "configs", [])
    assert list(report["packages"]) == list(NEURON_STACK)


def test_transformers_5_beside_transformers_neuronx_is_flagged() -> None:
    assert stack_warning({"transformers": "4.48.3", "transformers-neuronx": "0.13.1216"}) is None
    assert stack_warning({"transformers": "5.23.0", "transformers-neuronx": None}) is None  # torch backend only
    warning = stack_warning({"transformers": "5.23.0", "transformers-neuronx": "0.13.1216"})
    assert warning and "constraints" in warning and "5.23.0" in warning
