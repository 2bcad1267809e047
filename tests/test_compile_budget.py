"""What `compile --k 2..8` costs: its networks in the device-memory plan, and the
neuronx-cc processes that run at once bounded by the host's memory, each figure with its basis."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
from click.testing import CliRunner
from neuron_support import neuron_config
from topology_cases import neuron_pair

from neuron_ssp.backends.neuron.compile import compile_models
from neuron_ssp.cli import main
from neuron_ssp.config import config_from_dict
from neuron_ssp.errors import UsageError
from neuron_ssp.topology import plan_deployment
from neuron_ssp.topology.catalog import GIB
from neuron_ssp.topology.compile_plan import MINUTES_PER_NETWORK, PROCESS_BYTES, estimate_compile
from neuron_ssp.topology.memory import NETWORK_BYTES_PER_CORE
from neuron_ssp.topology.networks import Networks, compiled_networks, context_buckets, token_buckets
from neuron_ssp.topology.placement import loaded_models
from neuron_ssp.topology.plan import place_models

pytest_plugins = ["neuron_fixtures"]  # fixtures: neuronx, neuronx_any, tiny_model_dirs


def test_buckets_and_networks_follow_the_library() -> None:
    assert token_buckets(2048) == [128, 256, 512, 1024, 2048] and context_buckets(2048) == [64, 128, 256, 512, 1024]
    assert token_buckets(3000) == [128, 256, 512, 1024, 2048, 3000]  # n_positions is always the last bucket
    assert token_buckets(100) == [100]
    assert compiled_networks(2048, range(2, 9)) == Networks(token=5, context=5, speculation=35)
    assert compiled_networks(2048).total == 10  # a draft


def test_every_k_compiled_into_the_target_is_charged_in_the_memory_plan() -> None:
    config = config_from_dict(neuron_pair())  # Llama-2 70B + 7B, trn1.32xlarge, tp 32, 2048 positions
    one = plan_deployment(config)
    every = plan_deployment(config, windows=range(2, 9))
    extra = every.models["target"].footprint
    assert one.models["target"].footprint.extra_networks == 0
    assert extra.extra_networks == 6 * 5  # six more k, five token buckets each
    assert every.busiest_core_bytes - one.busiest_core_bytes == 30 * NETWORK_BYTES_PER_CORE
    assert every.to_dict()["models"]["target"]["network_bytes_per_core"] == 30 * NETWORK_BYTES_PER_CORE


def test_parallel_compiles_are_bounded_by_host_memory() -> None:
    placed = place_models(
        loaded_models(config_from_dict(neuron_pair())), "transformers-neuronx", "padding", tuple(range(2, 9))
    )
    target_weights = placed["target"].architecture.params * 2  # bf16, held on the host while compiling
    estimate = estimate_compile(placed, 512 * GIB)  # trn1.32xlarge
    assert [m.networks.total for m in estimate.models] == [45, 10]
    assert estimate.workers == (0.9 * 512 * GIB - target_weights) // PROCESS_BYTES == 20 == estimate.bound
    assert estimate.peak_host_bytes == target_weights + 20 * PROCESS_BYTES <= 0.9 * 512 * GIB
    assert estimate.minutes == (3 + 1) * MINUTES_PER_NETWORK  # 45 networks in 3 rounds, then the draft's 10
    text = " ".join(estimate.lines())
    assert "bounded by host memory" in text and "assumed" in text and "not measured" in text
    unknown = estimate_compile(placed, None)
    assert unknown.workers == 45 and unknown.bound is None  # the library's default: one process per network
    assert estimate_compile(placed, 10 * GIB).workers == 1  # never fewer than one


def test_compile_passes_the_bound_to_the_library(
    neuronx_any: ModuleType, tiny_model_dirs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1ade6d7: NeuronConfig(compilation_worker_count=...), read by to_neuron (base.py line 88); 7a30b42:
    its to_neuron calls compile() without a bound, so the model's compile gets parallel_degree."""
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(f"MemTotal: 1 kB\nMemAvailable: {int(3.5 / 0.9 * PROCESS_BYTES) // 1024} kB\n")
    monkeypatch.setattr("neuron_ssp.backends.neuron.env.MEMINFO", str(meminfo))
    config = neuron_config(
        tiny_model_dirs["target"], tiny_model_dirs["draft"], neuron={"compiled_dir": str(tmp_path / "compiled")}
    )
    compile_models(config, plan_deployment(config), [2, 3, 4])
    compiles = [d for _, c, d in neuronx_any.RUNTIME.events if c == "compile"]
    assert len(compiles) == 2 and all(d["parallel_degree"] == 3 for d in compiles)
    if neuronx_any.API == "sdk_2_21":
        built = [d for _, c, d in neuronx_any.RUNTIME.events if c == "from_pretrained"]
        assert all(d["neuron_config"].compilation_worker_count == 3 for d in built)


def test_a_compile_whose_networks_do_not_fit_is_refused_before_it_starts(
    neuronx: ModuleType, tiny_model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    """A Llama-3-70B-shaped target that fits with one k: 2..8 adds 6 x 12 networks (12 token buckets)."""
    config = neuron_config(
        tiny_model_dirs["target"],
        neuron={"compiled_dir": str(tmp_path / "compiled")},
        target={"architecture": "llama-3-70b", "tp_degree": 32, "n_positions": 150_000, "dtype": "bf16"},
    )
    assert plan_deployment(config).fits
    with pytest.raises(UsageError) as caught:
        compile_models(config, plan_deployment(config), list(range(2, 9)))
    (problem,) = caught.value.problems
    assert "72 more speculation networks" in problem.rule and "compile fewer k" in problem.fix
    assert neuronx.RUNTIME.calls() == []


def test_compile_prints_the_estimate_with_its_basis(
    neuronx: ModuleType, tiny_model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    import json

    import yaml

    config = neuron_config(tiny_model_dirs["target"], tiny_model_dirs["draft"])
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    result = CliRunner().invoke(
        main,
        ["compile", str(path), "--k", "2..4", "--out", str(tmp_path / "c"), "--compile-process-gib", "4", "--json"],
    )
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "networks to compile: target: 5 (1 token, 1 context, 3 speculation); draft: 2" in text
    assert "4 GiB per process assumed" in text and "estimated time" in text
    report = json.loads(result.output[result.output.index("{\n") :])
    assert report["estimate"]["process_bytes_assumed"] == 4 * GIB and len(report["results"]) == 2
