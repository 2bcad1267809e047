"""`python -m neuron_ssp` runs the CLI, and every command that prints timings takes --threads."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from click.testing import CliRunner

from neuron_ssp.cli import main


def test_python_dash_m_runs_the_cli() -> None:
    result = subprocess.run([sys.executable, "-m", "neuron_ssp", "--help"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "Usage: neuron-ssp" in result.stdout and "generate" in result.stdout


@pytest.mark.parametrize("command", [["generate", "hi"], ["compare", "hi"], ["latency"]])
def test_timing_commands_set_the_torch_threads(command: list[str], tmp_path, monkeypatch) -> None:
    """The model path is missing on purpose: the threads are set before the model loads."""
    calls: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    config = tmp_path / "c.yaml"
    config.write_text(f"target:\n  path: {tmp_path / 'missing-model'}\n")
    result = CliRunner().invoke(main, [command[0], "--threads", "1", "--config", str(config), *command[1:]])
    assert result.exit_code == 2 and "target.path" in result.output, result.output
    assert calls == [1]
