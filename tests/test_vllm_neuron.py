"""neuron.library vllm-neuron: the config rendered to AWS's EAGLE-3 tutorial command (`vllm serve` flags, our k as
num_speculative_tokens = k - 1), and `neuron-ssp serve` replacing itself by that command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from neuron_ssp.config import load_config
from neuron_ssp.deploy.vllm_neuron import VLLM_FLAGS, command_text, vllm_serve_args

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


def test_the_tutorial_config_renders_the_tutorials_command() -> None:
    args = vllm_serve_args(load_config(TUTORIAL))
    assert args == TUTORIAL_ARGS
    assert {a for a in args if a.startswith("--")} <= set(VLLM_FLAGS)
    assert "num_speculative_tokens" in command_text(load_config(TUTORIAL))


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
    assert ran["argv"] == [*TUTORIAL_ARGS[1:-1], "9001"] and ran["key"] == "secret-key"
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
