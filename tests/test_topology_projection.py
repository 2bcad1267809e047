"""`plan --engine`: projected ms/token and speedup from published latencies, α and k, each with its assumption."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from neuron_ssp.cli import main
from neuron_ssp.topology.projection import draft_steps, project, tokens_per_call


def test_native_and_fused_from_published_latencies() -> None:
    native = project("native", 5, 0.8, "trn1.32xlarge", "llama-3-70b", "llama-3-8b")
    fused = project("fused", 5, 0.8, "trn1.32xlarge", "llama-3-70b", "llama-3-8b")
    tau = (1 - 0.8**5) / 0.2
    assert tokens_per_call(0.8, 5) == pytest.approx(tau)
    assert (draft_steps("native", 5), draft_steps("fused", 5)) == (4, 5)
    assert native.speedup == pytest.approx(21.4 / ((21.4 + 4 * 4.7) / tau))
    assert fused.speedup == pytest.approx(21.4 / ((21.4 + 5 * 4.7) / tau))
    assert all(f.assumption for p in (native, fused) for f in p.figures)


def test_unknown_latencies_say_what_to_pass() -> None:
    projection = project("native", 4, 0.7, "inf2.48xlarge", "llama-3-70b", "llama-3-8b")
    assert projection.speedup is None
    notes = " ".join(f.assumption for f in projection.figures)
    assert "--ms-per-token" in notes and "--draft-ms-per-token" in notes
    given = project("native", 4, 0.7, "inf2.48xlarge", "llama-3-70b", "llama-3-8b", 30.0, 6.0)
    assert given.speedup == pytest.approx(30.0 / ((30.0 + 3 * 6.0) / tokens_per_call(0.7, 4)))


def test_plan_cli_prints_the_projection_in_json() -> None:
    result = CliRunner().invoke(
        main, ["plan", "configs/llama2-70b-7b-trn1-bf16.yaml", "--engine", "fused", "--alpha", "0.7", "--json"]
    )
    data = json.loads(result.output)
    figures = {f["name"]: f for f in data["projection"]["figures"]}
    assert data["projection"]["engine"] == "fused" and figures["α"]["value"] == 0.7
    assert figures["speedup"]["value"] > 1.0 and "Leviathan" in figures["tokens per target call τ"]["assumption"]
