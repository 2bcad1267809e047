"""Every table reads in an 80-column terminal: no cell or header cut to '…'.

Each command must also end with the exit code it documents and print its table: a command that stops
early on an error prints no table, which would otherwise pass for one that fits."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import tiny_llama
from tools_support import PROMPT_ROWS, pipeline_on, write_prompts

from neuron_ssp.backends.torch.scoring import TorchBackend
from neuron_ssp.cli import main
from neuron_ssp.cli.report import describe, fit_fields, pack_fields
from neuron_ssp.config import load_config

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


@pytest.fixture
def tiny_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """Commands load a tiny random Llama (with a character tokenizer) instead of the embedded model."""
    target = TorchBackend(tiny_llama(0), 512)
    for name in ("neuron_ssp.cli.tools", "neuron_ssp.cli.generate"):  # the package's `generate` is the command
        monkeypatch.setattr(sys.modules[name], "load_with_status", lambda config: pipeline_on(target, config))


def run_at_80(*args: str, exit_code: int = 0) -> str:
    result = CliRunner().invoke(main, list(args), env={"COLUMNS": "80"})
    assert result.exit_code == exit_code, (result.output, result.exception)
    assert "Traceback" not in result.output, result.output
    assert "…" not in result.output, result.output
    table_lines = [line for line in result.output.splitlines() if line[:1] in set("┏┃┡│└├┌┗┠")]
    assert all(len(line.rstrip()) <= 80 for line in table_lines), result.output
    return result.output


@pytest.mark.parametrize("config", sorted(CONFIGS.glob("llama*.yaml")), ids=lambda p: p.stem)
def test_plan_and_validate(config: Path) -> None:
    """Today's plan table cuts every header to 'mod…', 'arc…', 'dty…'."""
    assert "total per core" in run_at_80("plan", str(config))
    assert "$/M tok" in run_at_80("plan", str(config), "--all-instances")
    # 12 cores of 16 GiB cannot hold a 70B target and its draft: the plan says so and exits 1
    assert "does not fit" in run_at_80("plan", str(config), "--instance", "inf2.24xlarge", exit_code=1)
    assert ": valid" in run_at_80("validate", str(config))


def test_doctor() -> None:
    assert "made for" in run_at_80("doctor", "--instance", "trn1.32xlarge", "--configs", str(CONFIGS))


def test_generation_commands(tiny_model: None, tmp_path: Path) -> None:
    prompts = str(write_prompts(tmp_path / "prompts.jsonl", PROMPT_ROWS))
    assert "same tokens" in run_at_80("compare", "--max-new-tokens", "6", "--warmup", "0", "abcabcabc")
    assert "SSp ms/token" in run_at_80(
        "latency", "--max-new-tokens", "6", "--nb-prompts", "1", "--warmup", "0", "--prompts", prompts
    )
    assert "95% Wilson interval" in run_at_80("eval", "--nb-prompts", "2", "--answer-tokens", "3")
    bench = run_at_80("bench", "--prompts", prompts, "--nb-prompts", "1", "--max-new-tokens", "6")
    assert "HF lookup" in bench and "SSp ÷ HF" in bench and "geomean" in bench
    assert "report" in run_at_80(
        "bench", "--prompts", prompts, "--prompts", prompts, "--half", "report", "--max-new-tokens", "4"
    )


def header_fields(command: list[str]) -> list[str]:
    """The "name value" fields of the command's config header, as `describe` joins them with " | "."""
    temperature = command[command.index("--temperature") + 1] if "--temperature" in command else None
    overrides = {"sampling.temperature": float(temperature)} if temperature else {}
    return describe(load_config(None, overrides)).split(" | ")


HEADED_COMMANDS = {
    "generate": ["generate", "--max-new-tokens", "6", "abcabcabc"],
    "compare": ["compare", "--max-new-tokens", "6", "--warmup", "0", "abcabcabc"],
    "latency": ["latency", "--max-new-tokens", "6", "--nb-prompts", "1", "--warmup", "0", "--prompts"],
    "eval": ["eval", "--nb-prompts", "2", "--answer-tokens", "3"],
    "eval-lossless": ["eval", "--lossless", "--samples", "20", "--max-new-tokens", "2", "--temperature", "1.0"],
    "bench": ["bench", "--nb-prompts", "1", "--max-new-tokens", "6", "--prompts"],
    "bench-drafters": ["bench", "--nb-prompts", "1", "--max-new-tokens", "4", "--drafter", "ngram,suffix", "--prompts"],
    "tune-k": ["tune-k", "--k", "2,3", "--nb-prompts", "1", "--max-new-tokens", "4", "--prompts"],
}


@pytest.mark.parametrize("command", HEADED_COMMANDS.values(), ids=HEADED_COMMANDS.keys())
def test_the_config_header_breaks_between_fields_only(tiny_model: None, tmp_path: Path, command: list[str]) -> None:
    """At 80 columns `generate` printed 'acceptor ' on one line and 'probabilistic' on the next (compare:
    'k=16 (draft' / '15)'): every field must read whole on one line, and no line may pass 80 columns."""
    if command[-1] == "--prompts":
        command = [*command, str(write_prompts(tmp_path / "prompts.jsonl", PROMPT_ROWS))]
    lines = run_at_80(*command).splitlines()
    fields = header_fields(command)
    assert sum(len(field) for field in fields) + 3 * (len(fields) - 1) > 80  # the header needs two lines
    for field in fields:
        assert any(field in line for line in lines), (field, lines[:4])
    header = [line for line in lines if fields[-1] in line or fields[0] in line]
    assert all(len(line) <= 80 for line in header), header


def test_fields_are_packed_up_to_the_width_and_never_split() -> None:
    assert pack_fields(["a b", "cc d", "e"], 8) == ["a b", "cc d | e"]  # "cc d | e" is exactly 8
    assert pack_fields(["x" * 12, "y z", "w"], 8) == ["x" * 12, "y z | w"]  # too wide: a line of its own
    assert fit_fields("a b | cc d\nq r | s", 8) == "a b\ncc d\nq r | s"  # each line of a title on its own
