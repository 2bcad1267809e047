"""The Neuron self-test: a k-wide window against one-token calls, below and above cache position 64."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
from neuron_support import neuron_config, reimport_standin

from neuron_ssp.backends.neuron.load import load_neuron_backends
from neuron_ssp.backends.neuron.selftest import (
    BUCKET_EDGE,
    PositionCheck,
    SelfTestResult,
    check_self_test,
    run_self_test,
)
from neuron_ssp.errors import RuntimeProblem
from neuron_ssp.topology import plan_deployment

pytest_plugins = ["neuron_fixtures"]  # fixtures: neuronx, neuronx_any, tiny_model_dirs


def test_passes_on_the_correct_library_at_positions_on_both_sides_of_64(
    neuronx_any: ModuleType, tiny_model_dirs: dict[str, Path]
) -> None:
    config = neuron_config(tiny_model_dirs["target"], neuron={"self_test": False})
    target, _ = load_neuron_backends(config, plan_deployment(config))
    neuronx_any.RUNTIME.events.clear()
    result = run_self_test(target, "0.13.322")
    positions = [p.position for p in result.positions]
    assert min(positions) < BUCKET_EDGE <= max(positions)
    assert result.agreement() == 1.0 and result.max_abs_diff == 0.0
    windows = [d["cache_ids"] for _, c, d in neuronx_any.RUNTIME.events if c == "speculative_forward"]
    singles = [d["cache_ids"] for _, c, d in neuronx_any.RUNTIME.events if c == "forward" and d["cache_ids"]]
    assert all(len(w) == 4 for w in windows) and all(len(s) == 1 for s in singles)
    assert sorted(s[0] for s in singles) == sorted(slot for w in windows for slot in w)  # same slots both ways
    check_self_test(result, 0.9)  # no exception, no warning needed


def test_the_0623de2_cache_ids_capping_fails_the_load_with_the_fix(
    neuronx: ModuleType, tiny_model_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    reimport_standin(monkeypatch, NEURONX_STANDIN_SNAPSHOT="0623de2")
    config = neuron_config(tiny_model_dirs["target"])
    with pytest.raises(RuntimeProblem) as caught:
        load_neuron_backends(config, plan_deployment(config))
    (problem,) = caught.value.problems
    assert problem.field == "neuron.self_test"
    assert "0.13.322" in problem.rule and "below slot 64: 100%" in problem.rule
    assert "0623de2" in problem.fix and "pip install" in problem.fix


def test_the_capping_shows_per_position(
    neuronx: ModuleType, tiny_model_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    reimport_standin(monkeypatch, NEURONX_STANDIN_SNAPSHOT="0623de2")
    config = neuron_config(tiny_model_dirs["target"], neuron={"self_test": False})
    target, _ = load_neuron_backends(config, plan_deployment(config))
    result = run_self_test(target, "0.10.x")
    assert result.agreement(0, BUCKET_EDGE) == 1.0
    assert (result.agreement(BUCKET_EDGE) or 0.0) < 0.9 and result.max_abs_diff > 0.0


def test_high_but_inexact_agreement_warns_about_bf16_near_ties() -> None:
    rows = [PositionCheck(p, 0.01, p != 70) for p in range(8, 76)]
    result = SelfTestResult(4, "0.13.322", rows)
    with pytest.warns(UserWarning, match="near-ties"):
        check_self_test(result, 0.9)
    with pytest.raises(RuntimeProblem):
        check_self_test(result, 1.0)


def test_no_room_for_a_window_is_a_warning_not_a_failure() -> None:
    with pytest.warns(UserWarning, match="skipped"):
        check_self_test(SelfTestResult(12, "0.13.322", []), 0.9)
