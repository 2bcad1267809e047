"""matplotlib, scipy and ruamel.yaml are the optional `tools` extra: without them the CLI still works,
and a command that needs one says what to install before it loads a model, with no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import neuron_ssp.cli.tools as cli_tools
from neuron_ssp.cli import main

ROOT = Path(__file__).resolve().parents[1]
EXTRA = {
    "matplotlib": ("matplotlib", "matplotlib.figure"),
    "scipy": ("scipy", "scipy.stats"),
    "ruamel.yaml": ("ruamel", "ruamel.yaml", "ruamel.yaml.util"),
}
INSTALL = "pip install 'neuron-ssp[tools]'"


def without(monkeypatch: pytest.MonkeyPatch, package: str) -> None:
    """Make `package` unimportable, as in an environment installed without the extra."""
    for module in EXTRA[package]:
        monkeypatch.setitem(sys.modules, module, None)


@pytest.fixture
def no_model(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(config: object) -> None:
        raise AssertionError("the model was loaded before the missing package was reported")

    monkeypatch.setattr(cli_tools, "load_with_status", refuse)


@pytest.mark.parametrize(
    "package, args",
    [
        ("scipy", ["eval", "--nb-prompts", "2"]),
        ("scipy", ["eval", "--lossless", "--samples", "10"]),
        ("matplotlib", ["tune-k", "--k", "2,3", "--plot", "{tmp}/k.png"]),
        ("matplotlib", ["bench", "--nb-prompts", "1", "--plot", "{tmp}/bench.png"]),
        ("ruamel.yaml", ["tune-k", "--k", "2,3", "--write", "{tmp}/tuned.yaml"]),
    ],
    ids=["eval", "eval-lossless", "tune-k-plot", "bench-plot", "tune-k-write"],
)
def test_a_command_without_its_package_says_what_to_install(monkeypatch, no_model, tmp_path, package, args):
    (tmp_path / "tuned.yaml").write_text("speculation:\n  k: 4\n")
    without(monkeypatch, package)
    result = CliRunner().invoke(main, [a.format(tmp=tmp_path) for a in args], env={"COLUMNS": "200"})
    assert result.exit_code == 1, (result.output, result.exception)
    assert f"needs the package {package.split('.')[0]}" in result.output and INSTALL in result.output
    assert "Traceback" not in result.output and not isinstance(result.exception, AssertionError)


BLOCK_EXTRA = (
    f"import sys\nfor name in {[m for modules in EXTRA.values() for m in modules]!r}:\n    sys.modules[name] = None\n"
)


def test_the_cli_and_validate_run_without_the_extra() -> None:
    script = BLOCK_EXTRA + (
        "from neuron_ssp.cli import main\nmain(['validate', 'configs/llama2-70b-7b-trn1-bf16.yaml'])\n"
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert ": valid" in result.stdout
