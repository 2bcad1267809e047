"""A `module:Class` acceptor next to the user imports from the console script, as uvicorn's `module:app`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from neuron_ssp.errors import UsageError
from neuron_ssp.speculation.acceptors import build_acceptor
from neuron_ssp.speculation.sampling import SamplingParams

CLI = Path(sys.executable).parent / "neuron-ssp"  # the console script installed next to this Python

PLUGIN = """
from pathlib import Path
from neuron_ssp.speculation.acceptors import GreedyAcceptor

Path("imported.txt").write_text("my_acceptors imported")


class StrictAcceptor(GreedyAcceptor):
    pass
"""


def test_console_script_imports_a_plugin_from_the_working_directory(tmp_path: Path) -> None:
    """The console script's sys.path starts at its bin/ directory, not the user's: today's code fails
    with ModuleNotFoundError here. The model path is missing on purpose, so the run stops right after
    the acceptor was built, with the model's error and not the acceptor's."""
    assert CLI.is_file(), f"{CLI} is missing: install the package (pip install -e .) into this Python"
    (tmp_path / "my_acceptors.py").write_text(PLUGIN)
    (tmp_path / "c.yaml").write_text(f"target:\n  path: {tmp_path / 'missing-model'}\n")
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("PYTHONSAFEPATH", None)
    result = subprocess.run(
        [str(CLI), "generate", "--config", "c.yaml", "--acceptor", "my_acceptors:StrictAcceptor", "hi"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    output = result.stdout + result.stderr
    assert (tmp_path / "imported.txt").is_file(), output
    assert "speculation.acceptor" not in output, output
    assert result.returncode == 2 and "target.path" in output, output


def test_plugin_import_leaves_sys_path_as_it_was(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "strict_plugin_for_test.py").write_text(PLUGIN.replace('Path("imported.txt")', 'Path("x.txt")'))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    before = list(sys.path)
    acceptor = build_acceptor("strict_plugin_for_test:StrictAcceptor", SamplingParams(), None)
    assert type(acceptor).__name__ == "StrictAcceptor"
    assert sys.path == before
    monkeypatch.delitem(sys.modules, "strict_plugin_for_test")


def test_a_missing_plugin_names_the_directory_it_looked_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError) as info:
        build_acceptor("no_such_plugin_here:Thing", SamplingParams(), None)
    problem = info.value.problems[0]
    assert "no_such_plugin_here.py" in problem.fix and str(tmp_path) in problem.fix
