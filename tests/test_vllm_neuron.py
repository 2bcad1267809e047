"""neuron.library vllm-neuron: the config rendered to AWS's EAGLE-3 tutorial command (`vllm serve` flags, our k as
num_speculative_tokens = k - 1), and `neuron-ssp serve` replacing itself by that command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sagemaker_fixtures import StubbedSageMaker, assert_valid_request, endpoint_plan

from neuron_ssp.config import load_config
from neuron_ssp.deploy.vllm_neuron import TOOL_ARGS, VLLM_FLAGS, command_text, vllm_serve_args

pytest_plugins = ["sagemaker_fixtures"]
REPO = Path(__file__).resolve().parents[1]
TUTORIAL = REPO / "configs" / "vllm-neuron-llama31-8b-eagle3.yaml"
# tutorial-eagle3-speculative-decoding-llama-3-1.md:176-188 (aws-neuron-sdk 81ce03ae), with our default port
TUTORIAL_ARGS = [
    "vllm",
    "serve",
    "meta-llama/Llama-3.1-8B-Instruct",
    "--tensor-parallel-size",
    "8",
    "--max-num-seqs",
    "2",
    "--max-model-len",
    "2048",
    "--dtype",
    "bfloat16",
    "--no-enable-prefix-caching",
    "--speculative-config",
    '{"method": "eagle3", "model": "RedHatAI/Llama-3.1-8B-Instruct-speculator.eagle3", "num_speculative_tokens": 3}',
    "--host",
    "127.0.0.1",
    "--port",
    "8000",
]


def with_tools(args: list[str]) -> list[str]:
    """A tutorial command with our tool flags before its address (they are not the tutorial's)."""
    at = args.index("--host")
    return [*args[:at], *TOOL_ARGS, *args[at:]]


def test_the_tutorial_config_renders_the_tutorials_command() -> None:
    """The tutorial's command, and the tool flags that serve tools as `neuron-ssp serve` does (features-guide.md,
    "Tool calling": auto and none read by vLLM's Llama3JsonToolParser)."""
    args = vllm_serve_args(load_config(TUTORIAL))
    assert args == with_tools(TUTORIAL_ARGS)
    assert {a for a in args if a.startswith("--")} <= set(VLLM_FLAGS)
    assert "num_speculative_tokens" in command_text(load_config(TUTORIAL))


# Above the tutorial's 2 rows ("Higher values require additional decode batch-bucket coverage", tutorial :59-60): the
# decode batch buckets (`num_seqs_buckets`, features-guide.md:70) in the current plugin's --additional-config form,
# as AWS's GPT-OSS EAGLE-3 tutorial passes them (tutorial-eagle3-speculative-decoding-gpt-oss.md:203-207), the
# largest equal to --max-num-seqs (reference-configuration.md:49); all at aws-neuron-sdk 81ce03ae vllm-neuron/docs.
FOUR_ROWS_ARGS = [
    "vllm",
    "serve",
    "meta-llama/Llama-3.1-8B-Instruct",
    "--tensor-parallel-size",
    "8",
    "--max-num-seqs",
    "4",
    "--max-model-len",
    "2048",
    "--dtype",
    "bfloat16",
    "--no-enable-prefix-caching",
    "--additional-config",
    '{"neuron_config": {"num_seqs_buckets": [1, 2, 4]}}',
    "--speculative-config",
    '{"method": "eagle3", "model": "RedHatAI/Llama-3.1-8B-Instruct-speculator.eagle3", "num_speculative_tokens": 3}',
    "--host",
    "127.0.0.1",
    "--port",
    "8000",
]


def test_more_rows_than_the_tutorial_render_the_decode_batch_buckets() -> None:
    assert vllm_serve_args(load_config(TUTORIAL, {"target.batch_size": 4, "draft.batch_size": 4})) == with_tools(
        FOUR_ROWS_ARGS
    )
    six = vllm_serve_args(load_config(TUTORIAL, {"target.batch_size": 6, "draft.batch_size": 6}))
    extra = json.loads(six[six.index("--additional-config") + 1])
    assert extra == {"neuron_config": {"num_seqs_buckets": [1, 2, 4, 6]}}
    assert "--override-neuron-config" not in six  # the old NxDI-based plugin's flag (migration :93-103)
    assert {a for a in six if a.startswith("--")} <= set(VLLM_FLAGS)


def test_k_is_the_window_and_no_head_is_the_baseline() -> None:
    spec = json.loads(vllm_serve_args(load_config(TUTORIAL, {"speculation.k": 6}))[13])
    assert spec["num_speculative_tokens"] == 5
    baseline = vllm_serve_args(load_config(TUTORIAL, {"speculation.drafter": "none"}))
    assert "--speculative-config" not in baseline


def test_sagemaker_listens_on_8080_with_the_served_name() -> None:
    config = load_config(TUTORIAL, {"serve.sagemaker": True, "serve.served_model_name": "llama"})
    args = vllm_serve_args(config)
    assert args[-6:] == ["--host", "0.0.0.0", "--port", "8080", "--served-model-name", "llama"]


def fake_vllm(tmp_path: Path) -> Path:
    """A `vllm` on PATH that records its argv and the API key it was given."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "vllm"
    ran = str(tmp_path / "ran.json")
    script.write_text(
        f"#!{sys.executable}\nimport json, os, sys\n"
        f"record = {{'argv': sys.argv[1:], 'key': os.environ.get('VLLM_API_KEY')}}\n"
        f"json.dump(record, open({ran!r}, 'w'))\n"
    )
    script.chmod(0o755)
    return bin_dir


def serve(tmp_path: Path, env: dict[str, str], *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "neuron_ssp", "serve", "--config", str(TUTORIAL), *extra],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
        timeout=120,
        check=False,
    )


def test_serve_execs_vllm_serve_with_the_key_from_the_environment(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(TUTORIAL.read_text() + "  api_key_env: MY_KEY\n")
    bin_dir = fake_vllm(tmp_path)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "MY_KEY": "secret-key"}
    result = subprocess.run(
        [sys.executable, "-m", "neuron_ssp", "serve", "--config", str(config), "--port", "9001"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    ran = json.loads((tmp_path / "ran.json").read_text())
    assert ran["argv"] == [*with_tools(TUTORIAL_ARGS)[1:-1], "9001"] and ran["key"] == "secret-key"
    assert "secret-key" not in result.stdout + result.stderr  # never on the command line


def test_serve_without_vllm_names_the_venv(tmp_path: Path) -> None:
    result = serve(tmp_path, {"PATH": str(Path(sys.executable).parent)})
    assert result.returncode == 1, result.stderr
    assert "aws_neuronx_venv_pytorch_inference_vllm_0_24_0_1_1_0" in result.stderr


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ({"speculation.drafter": "model"}, "speculation.drafter"),
        ({"platform.instance_type": "inf2.48xlarge"}, "platform.instance_type"),
    ],
)
def test_serve_refuses_what_vllm_neuron_cannot_run(tmp_path: Path, override: dict, field: str) -> None:
    from neuron_ssp.deploy.vllm_neuron import exec_vllm_serve
    from neuron_ssp.errors import UsageError

    with pytest.raises(UsageError) as refused:
        exec_vllm_serve(load_config(TUTORIAL, override))
    assert field in [p.field for p in refused.value.problems]


def test_the_endpoint_runs_vllm_serve_from_the_vllm_dlc_on_8080(stubbed_sagemaker: StubbedSageMaker) -> None:
    """SageMaker: our image FROM vllm-neuron's DLC, the config with the models under /opt/ml/model; its
    `neuron-ssp serve --sagemaker` execs `vllm serve` on 0.0.0.0:8080 (vLLM's /ping and /invocations).
    Requests pass botocore's ParamValidator and the service model's enums and patterns."""
    plan = endpoint_plan(TUTORIAL)
    assert plan.image_uri.endswith("-vllm-neuron-sdk2.32")
    assert "pytorch-inference-vllm-neuronx:0.24.0.1.1.0-neuronx-py313-sdk2.32.0-ubuntu24.04" in plan.software
    assert plan.capacity.slots == 2
    served = json.loads(plan.model_request["PrimaryContainer"]["Environment"]["NEURON_SSP_CONFIG"])
    assert served["neuron"]["library"] == "vllm-neuron"
    assert served["draft"]["path"] == "/opt/ml/model/Llama-3.1-8B-Instruct-speculator.eagle3"
    assert plan.serves is not None and plan.serves.startswith("vllm serve /opt/ml/model/Llama-3.1-8B-Instruct ")
    assert plan.serves.endswith("--host 0.0.0.0 --port 8080")
    variant = plan.endpoint_config_request["ProductionVariants"][0]
    assert variant["InstanceType"] == "ml.trn2.48xlarge" and "VolumeSizeInGB" not in variant  # local NVMe
    client = stubbed_sagemaker.clients.sagemaker
    for operation, request in (
        ("CreateModel", plan.model_request),
        ("CreateEndpointConfig", plan.endpoint_config_request),
        ("CreateEndpoint", plan.endpoint_request),
    ):
        assert_valid_request(client, operation, request)


def test_the_image_build_for_vllm_neuron_starts_from_its_dlc(monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from neuron_ssp.cli import main

    monkeypatch.setattr("neuron_ssp.deploy.sagemaker.image.docker_available", lambda: False)
    monkeypatch.chdir(REPO)
    result = CliRunner().invoke(main, ["deploy", "image", "build", "--config", str(TUTORIAL)], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    assert "BASE_IMAGE=public.ecr.aws/neuron/pytorch-inference-vllm-neuronx:0.24.0.1.1.0" in result.output
    assert "LIBRARY_MODULE=vllm" in result.output and "-vllm-neuron-sdk2.32" in result.output


def test_the_ec2_launch_boots_the_vllm_venv_and_serves_at_boot() -> None:
    import base64
    import gzip
    from datetime import datetime, timezone

    from deploy_fixtures import OWNER_ARN, REGION

    from neuron_ssp.deploy import ami
    from neuron_ssp.deploy.launch_plan import LaunchFacts, LaunchOptions, model_paths, plan_launch

    config = load_config(TUTORIAL)
    facts = LaunchFacts(REGION, ami.Ami("ami-0x", "DLAMI", "2026-08-17", "/dev/sda1", "pinned"), OWNER_ARN)
    options = LaunchOptions(region=REGION, name="eagle3", instance_profile="p")
    plan = plan_launch(
        config, TUTORIAL, options, facts, now=datetime(2026, 11, 1, tzinfo=timezone.utc), client_token="t"
    )
    assert plan.serves == command_text(config)
    assert ami.pin_for_config(config).filters()[1] == {"Name": "description", "Values": ["*Neuron SDK 2.32*"]}
    user_data = plan.params["UserData"]
    text = gzip.decompress(base64.b64decode(user_data)).decode() if not user_data.startswith("#!") else user_data
    assert "/opt/aws_neuronx_venv_pytorch_inference_vllm_0_24_0_1_1_0" in text and "neuron-ssp-server" in text
    assert model_paths(config) == ()  # Hugging Face ids: vLLM downloads them
    assert not any("AMI must already hold" in w for w in plan.warnings)


@pytest.mark.parametrize(
    "command", [["compile", str(TUTORIAL), "--out", "unused"], ["generate", "--config", str(TUTORIAL), "hi"]]
)
def test_commands_that_load_models_refuse_a_vllm_neuron_config(command: list[str]) -> None:
    from click.testing import CliRunner

    from neuron_ssp.cli import main

    result = CliRunner().invoke(main, command, env={"COLUMNS": "200"})
    assert result.exit_code == 2 and "loaded and compiled by vLLM itself" in result.output
