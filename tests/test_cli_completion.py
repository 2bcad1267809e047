"""Shell completion as the README documents it: click's `_NEURON_SSP_COMPLETE` variable prints a script
for each shell, and the script's callback completes commands and choices."""

from __future__ import annotations

import re
from pathlib import Path

from click.testing import CliRunner

from neuron_ssp.cli import main

README = Path(__file__).resolve().parents[1] / "README.md"
DOCUMENTED = re.compile(r"^(_NEURON_SSP_COMPLETE)=(\w+) neuron-ssp ", re.MULTILINE)


def complete(*env: tuple[str, str]) -> str:
    result = CliRunner().invoke(main, [], prog_name="neuron-ssp", env=dict(env))
    assert result.exit_code == 0, result.output
    return result.output


def test_every_documented_shell_gets_its_script() -> None:
    documented = DOCUMENTED.findall(README.read_text())
    assert {shell for _, shell in documented} == {"bash_source", "zsh_source", "fish_source"}
    for variable, shell in documented:
        script = complete((variable, shell))
        assert "_neuron_ssp_completion" in script and "_NEURON_SSP_COMPLETE=" in script, script


def test_the_callback_completes_commands_and_choices() -> None:
    def words(line: str) -> list[str]:
        cword = str(len(line.split()) - (0 if line.endswith(" ") else 1))
        out = complete(("_NEURON_SSP_COMPLETE", "bash_complete"), ("COMP_WORDS", line), ("COMP_CWORD", cword))
        return [entry.split(",")[1] for entry in out.splitlines()]

    assert words("neuron-ssp tu") == ["tune-k"]
    assert words("neuron-ssp plan x.yaml --engine ") == ["native", "fused"]
    assert words("neuron-ssp eval --interval ") == ["wilson", "clopper-pearson", "wald"]
