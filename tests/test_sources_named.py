"""What `plan` prints cites its sources by names a reader can look up (never "the seed" or DESIGN.md)."""

from __future__ import annotations

import re
from pathlib import Path

from click.testing import CliRunner

from neuron_ssp.cli import main

ROOT = Path(__file__).resolve().parents[1]
UNNAMED = re.compile(r"seed blog|the seed's|seed's |\bthe seed\b|DESIGN\.md|AWS's sample", re.IGNORECASE)


def test_plan_output_names_its_sources() -> None:
    result = CliRunner().invoke(
        main, ["plan", str(ROOT / "configs" / "llama2-70b-7b-trn1-bf16.yaml")], env={"COLUMNS": "200"}
    )
    assert result.exit_code == 0, result.output
    assert not UNNAMED.search(result.output), result.output
    assert "AWS Machine Learning Blog" in result.output and "AWS Neuron docs" in result.output
