"""Deploy for NxD Inference configs: the DLAMI and venv per library and instance, the NxDI DLC for the SageMaker
image, and the Neuron SDK with its support status shown before anything is paid for. Botocore's Stubber checks
the DescribeImages request; no AWS call is made."""

from __future__ import annotations

import base64
import gzip
from datetime import datetime, timezone
from pathlib import Path

import deploy_fixtures
import pytest
from click.testing import CliRunner
from deploy_fixtures import OWNER_ARN, REGION, TRN1_CONFIG, StubbedAws
from sagemaker_fixtures import endpoint_plan

from neuron_ssp.cli import main
from neuron_ssp.config import load_config
from neuron_ssp.deploy import ami
from neuron_ssp.deploy.launch_plan import LaunchFacts, LaunchOptions, plan_launch

stubbed = deploy_fixtures.stubbed  # botocore Stubber on every client
stub_session = deploy_fixtures.stub_session

CONFIGS = Path(__file__).parents[1] / "configs"
NXDI_TRN1 = CONFIGS / "nxdi-llama31-70b-8b-trn1-bf16.yaml"
NXDI_INF2 = CONFIGS / "nxdi-llama31-70b-8b-inf2-bf16.yaml"
NXDI_TRN2 = CONFIGS / "nxdi-llama33-70b-32-1b-trn2-bf16.yaml"
NOW = datetime(2026, 11, 1, 12, 0, tzinfo=timezone.utc)


@pytest.mark.parametrize(
    ("path", "sdk", "venv"),
    [
        (TRN1_CONFIG, "2.25", "/opt/aws_neuronx_venv_pytorch_2_7_transformers"),
        (NXDI_TRN1, "2.28", "/opt/aws_neuronx_venv_pytorch_2_9_nxd_inference"),
        (NXDI_INF2, "2.28", "/opt/aws_neuronx_venv_pytorch_2_9_nxd_inference"),
        (NXDI_TRN2, "2.31", "/opt/aws_neuronx_venv_pytorch_2_9_nxd_inference"),
    ],
)
def test_each_library_and_instance_gets_its_dlami_release_and_venv(path: Path, sdk: str, venv: str) -> None:
    pin = ami.pin_for_config(load_config(path))
    assert (pin.sdk, pin.venv) == (sdk, venv)


def test_the_nxdi_dlami_is_looked_up_by_its_sdk(stubbed: StubbedAws) -> None:
    image = {
        "ImageId": "ami-0nxdi228",
        "Name": "Deep Learning AMI Neuron (Ubuntu 24.04) 20260301",
        "Description": "Deep Learning AMI Neuron (Ubuntu 24.04), Neuron SDK 2.28.1",
        "CreationDate": "2026-03-01T00:00:00.000Z",
        "RootDeviceName": "/dev/sda1",
        "BlockDeviceMappings": [],
    }
    stubbed.ec2.add_response(
        "describe_images",
        {"Images": [image]},
        {
            "Owners": ["amazon"],
            "IncludeDeprecated": True,
            "Filters": [
                {"Name": "name", "Values": ["Deep Learning AMI Neuron (Ubuntu 24.04) *"]},
                {"Name": "description", "Values": ["*Neuron SDK 2.28*"]},
                {"Name": "architecture", "Values": ["x86_64"]},
                {"Name": "state", "Values": ["available"]},
            ],
        },
    )
    chosen = ami.resolve_ami("pinned", stubbed.clients.ec2, stubbed.clients.ssm, REGION, ami.pin_for("nxdi", "trn1"))
    assert chosen.image_id == "ami-0nxdi228" and chosen.source == "pinned Neuron SDK 2.28"


@pytest.mark.parametrize(
    ("path", "shown"),
    [
        (NXDI_TRN1, "nxdi in /opt/aws_neuronx_venv_pytorch_2_9_nxd_inference, Neuron SDK 2.28 (NxD Inference 0.8"),
        (NXDI_TRN2, "Neuron SDK 2.31 (NxD Inference 0.10: supported in maintenance mode"),
        (
            TRN1_CONFIG,
            "transformers-neuronx in /opt/aws_neuronx_venv_pytorch_2_7_transformers, Neuron SDK 2.25 "
            "(transformers-neuronx: out of support",
        ),
    ],
)
def test_the_launch_plan_boots_the_library_venv_and_says_which_sdk(path: Path, shown: str) -> None:
    facts = LaunchFacts(REGION, ami.Ami("ami-0x", "DLAMI", "2026-03-01", "/dev/sda1", "pinned"), OWNER_ARN)
    plan = plan_launch(
        load_config(path),
        path,
        LaunchOptions(region=REGION, name="nx", instance_profile="p"),
        facts,
        now=NOW,
        client_token="neuron-ssp-0123456789abcdef",
    )
    assert shown in plan.software
    user_data = plan.params["UserData"]
    text = gzip.decompress(base64.b64decode(user_data)).decode() if not user_data.startswith("#!") else user_data
    assert ami.pin_for_config(load_config(path)).venv in text


def test_the_endpoint_uses_the_nxdi_image_and_says_its_sdk() -> None:
    plan = endpoint_plan(NXDI_INF2)
    assert plan.image_uri.rsplit(":", 1)[1].endswith("-nxdi-sdk2.28")  # what `deploy image push --config` pushes
    assert "Neuron SDK 2.28" in plan.software
    assert "pytorch-inference-neuronx:2.9.0-neuronx-py312-sdk2.28.0-ubuntu24.04" in plan.software
    tnx = endpoint_plan()
    assert "-nxdi" not in tnx.image_uri and "Neuron SDK 2.25" in tnx.software


def test_image_build_for_an_nxdi_config_starts_from_the_nxdi_dlc(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("neuron_ssp.deploy.sagemaker.image.docker_available", lambda: False)
    monkeypatch.chdir(Path(__file__).parents[1])
    result = CliRunner().invoke(main, ["deploy", "image", "build", "--config", str(NXDI_TRN2)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert (
        "BASE_IMAGE=public.ecr.aws/neuron/pytorch-inference-neuronx:2.9.0-neuronx-py312-sdk2.31.1-ubuntu24.04"
        in result.output
    )
    assert "-nxdi-sdk2.31" in result.output and "Neuron SDK 2.31" in result.output
    plain = CliRunner().invoke(main, ["deploy", "image", "build"], env={"COLUMNS": "200"})
    assert "BASE_IMAGE" not in plain.output  # the Dockerfile's transformers-neuronx DLC
