"""The NeuronConfigs our NxDI backend builds (backends/nxdi/api.py, load.py), checked on NxDI's own classes: those of
every shipped config, scaled down (tests/nxdi_support/scaled.py) - a target and its draft, fused speculation with a
draft model or an EAGLE-3 head, continuous batching. Building only: nothing is loaded or run.

Runs in .venv-nxdi (`bash .ci/nxdi.sh`); skips elsewhere with the reason (tests/nxdi_fixtures.py).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from nxdi_support.scaled import ScaledCase, scaled_case

pytest_plugins = ["nxdi_fixtures"]

CONFIGS = Path(__file__).parents[1] / "configs"
SHIPPED = sorted(path.name for path in CONFIGS.glob("nxdi-*.yaml"))
EAGLE3 = "nxdi-llama31-8b-eagle3-trn2.yaml"


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ScaledCase]:
    root = tmp_path_factory.mktemp("neuron-configs")
    return {name: scaled_case(CONFIGS / name, root / name.removesuffix(".yaml")) for name in SHIPPED}


def built(case: ScaledCase) -> dict[str, Any]:
    """The NeuronConfigs of one config, by role: 'target' and 'draft' (a draft model or the EAGLE head)."""
    from neuron_ssp.backends.nxdi.api import load_nxdi
    from neuron_ssp.backends.nxdi.load import NxdiModels, fused_application
    from neuron_ssp.backends.resolve import resolve_models
    from neuron_ssp.topology import plan_deployment

    config = case.config()
    plan = plan_deployment(config)
    models = NxdiModels(config, plan, load_nxdi(plan.instance.generation), resolve_models(config))
    k = config.speculation.k
    if config.speculation.engine == "fused":
        app, _ = fused_application(models)
        return {"target": app.neuron_config, "draft": app.config.fused_spec_config.draft_config.neuron_config}
    return {role: models.application(role, k if role == "target" else 0)[0].neuron_config for role in plan.load_order}


def test_no_neuron_config_we_build_has_an_argument_nxdi_does_not_know(
    nxdi_stubs: list[str], cases: dict[str, ScaledCase], caplog: pytest.LogCaptureFixture
) -> None:
    """NxDI only logs an unknown NeuronConfig argument (config.py:639-640 at 4bcdc54b) and goes on without it."""
    kinds = set()
    with caplog.at_level(logging.WARNING):
        for case in cases.values():
            configs = built(case)
            kinds |= {
                "fused" if configs["target"].enable_fused_speculation else "target and draft",
                "EAGLE head" if configs["draft"].is_eagle_draft else "draft model",
                "continuous batching" if configs["target"].is_continuous_batching else "batch 1",
            }
    assert kinds == {"fused", "target and draft", "EAGLE head", "draft model", "continuous batching", "batch 1"}
    logged = [record.getMessage() for record in caplog.records]
    assert [message for message in logged if "Unexpected keyword arguments" in message] == []


def test_the_eagle3_head_runs_with_the_targets_sequence_parallelism(
    nxdi_stubs: list[str], cases: dict[str, ScaledCase]
) -> None:
    """NxDI's demo gives the head a copy of the target's config (inference_demo.py:504-518); sequence parallelism
    then needs the head's cc_pipeline_tiling_factor at 1 (backends/nxdi/api.py eagle_head)."""
    configs = built(cases[EAGLE3])
    target, head = configs["target"], configs["draft"]
    assert (target.is_eagle3, target.sequence_parallel_enabled, head.is_eagle_draft) == (True, True, True)
    assert (head.sequence_parallel_enabled, head.cc_pipeline_tiling_factor) == (True, 1)


def test_the_eagle_head_is_not_itself_fused_as_in_nxdis_demo(
    nxdi_stubs: list[str], cases: dict[str, ScaledCase]
) -> None:
    """`enable_eagle_speculation` turns fused speculation on (config.py:255-256); the demo turns it off again on the
    head's copy of the target's config (inference_demo.py:515)."""
    head = built(cases[EAGLE3])["draft"]
    assert (head.enable_eagle_speculation, head.enable_fused_speculation) == (True, False)
