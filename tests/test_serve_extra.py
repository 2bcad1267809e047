"""The server's commands without the `serve` extra: what to install, no traceback (bench-serve's client, httpx, was
only in the test extra: a user with `neuron-ssp[serve]` got a ModuleNotFoundError traceback)."""

from __future__ import annotations

import sys

import pytest
from click.testing import CliRunner

from neuron_ssp.cli import main


def test_bench_serve_without_its_client_package_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "neuron_ssp.tools.serve_load", raising=False)  # imported afresh, without httpx
    monkeypatch.setitem(sys.modules, "httpx", None)
    result = CliRunner().invoke(main, ["bench-serve", "--clients", "1"], env={"COLUMNS": "200"})
    assert result.exit_code == 1, (result.output, result.exception)
    assert "bench-serve = 'httpx'" in result.output and "pip install 'neuron-ssp[serve]'" in result.output
    assert "Traceback" not in result.output and not isinstance(result.exception, ModuleNotFoundError)
