"""platform.prefix_cache where it cannot run: refused by `validate` with the reason from each library's source, or at
load where only the loaded backend knows; vllm-neuron's command follows the setting."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import tiny_llama

from neuron_ssp.backends.torch.scoring import TorchBackend
from neuron_ssp.config import load_config
from neuron_ssp.deploy.vllm_neuron import VLLM_FLAGS, vllm_serve_args
from neuron_ssp.errors import UsageError
from neuron_ssp.pipeline.build import prefix_pool_bytes
from neuron_ssp.topology import validate_config

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
ON = {"platform.prefix_cache": True}


def refusal(config_name: str, overrides: dict | None = None) -> str | None:
    config = load_config(CONFIGS / config_name if config_name else None, {**ON, **(overrides or {})})
    problems = [p for p in validate_config(config).errors if p.field == "platform.prefix_cache"]
    return problems[0].rule if problems else None


@pytest.mark.parametrize(
    ("config_name", "cited"),
    [
        ("llama3-70b-8b-trn1-bf16.yaml", "llama/hlo.py:672-676"),  # transformers-neuronx
        ("nxdi-llama31-70b-8b-trn1-bf16.yaml", "feature-guide.rst:910-913"),  # NxD Inference, our engines
        ("nxdi-llama31-8b-eagle3-trn2.yaml", "feature-guide.rst:910-913"),
    ],
)
def test_neuron_libraries_that_cannot_reuse_a_prefix_are_refused_with_the_reason_from_their_source(config_name, cited):
    rule = refusal(config_name)
    assert rule is not None and cited in rule


def test_left_out_it_is_no_problem_anywhere():
    for path in CONFIGS.glob("*.yaml"):
        config = load_config(path)
        assert config.platform.prefix_cache is None
        assert not [p for p in validate_config(config).errors if p.field == "platform.prefix_cache"], path.name


def test_the_torch_backend_takes_it_on_the_compact_forward_and_refuses_it_on_hugging_faces():
    assert refusal("") is None
    rule = refusal("", {"platform.forward": "hf"})
    assert rule is not None and "DynamicCache" in rule


def test_vllm_neuron_renders_it_and_refuses_it_at_one_sequence():
    tutorial = CONFIGS / "vllm-neuron-llama31-8b-eagle3.yaml"
    assert "--no-enable-prefix-caching" in vllm_serve_args(load_config(tutorial))  # the tutorial's setting
    on = load_config(tutorial, ON)
    args = vllm_serve_args(on)
    assert "--enable-prefix-caching" in args and "--no-enable-prefix-caching" not in args
    assert set(a for a in args if a.startswith("--")) <= set(VLLM_FLAGS)
    report = validate_config(on)
    assert not [p for p in report.errors if p.field == "platform.prefix_cache"]
    assert [p for p in report.warnings if p.field == "platform.prefix_cache"]  # EAGLE-3: off the tutorial's path
    one = refusal("vllm-neuron-llama31-8b-eagle3.yaml", {"target.batch_size": 1, "draft.batch_size": 1})
    assert one is not None and "README.md:118" in one


def test_true_on_a_backend_without_blocks_is_refused_at_load_naming_the_field():
    config = load_config(None, ON)
    without_kernel = TorchBackend(tiny_llama(0), 64, pack=False)
    with pytest.raises(UsageError) as refused:
        prefix_pool_bytes(config, without_kernel)
    assert refused.value.problems[0].field == "platform.prefix_cache"
    assert prefix_pool_bytes(load_config(None), without_kernel) is not None  # left out: on where it can run
    assert prefix_pool_bytes(load_config(None, {"platform.prefix_cache": False}), without_kernel) is None
    assert prefix_pool_bytes(load_config(None, {"platform.prefix_pool_mb": 3}), without_kernel) == 3 << 20
