"""Which backend runs which EAGLE drafter: refused before anything loads, with field, value, rule and fix."""

from __future__ import annotations

import pytest

from neuron_ssp.config import config_from_dict
from neuron_ssp.topology import validate_config

HEAD = {"path": "embedded:smollm2-135m-instruct-eagle3"}


def drafter_errors(drafter: str) -> list:
    config = config_from_dict({"speculation": {"drafter": drafter}, "draft": HEAD})
    return [p for p in validate_config(config).errors if p.field == "speculation.drafter"]


def test_eagle1_is_refused_on_torch_for_good():
    (problem,) = drafter_errors("eagle")
    assert problem.value == "eagle" and "NxD Inference's fused speculation" in problem.rule
    assert "drafter: eagle3" in problem.fix


@pytest.mark.parametrize("drafter", ["ngram", "model", "suffix", "none", "eagle3", "ngram+eagle3"])
def test_other_drafters_pass_the_drafter_rule(drafter):
    assert drafter_errors(drafter) == []


def test_the_combined_drafter_is_torch_only():
    neuron = {
        "target": {"path": "/models/llama-2-7b"},
        "platform": {"backend": "neuron", "instance_type": "trn1.2xlarge"},
    }
    config = config_from_dict({"speculation": {"drafter": "ngram+eagle3"}, "draft": HEAD, **neuron})
    (problem,) = [p for p in validate_config(config).errors if p.field == "speculation.drafter"]
    assert "torch backend only" in problem.rule
