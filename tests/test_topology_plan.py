"""The worked examples of the AWS Machine Learning Blog post (2024-08-05) come out of plan_deployment;
memory, placement and catalog arithmetic."""

from __future__ import annotations

import json
from typing import Any

import pytest
from topology_cases import LLAMA2_7B, LLAMA3_70B, merged, neuron_pair

from neuron_ssp.config import ModelConfig, config_from_dict, load_config
from neuron_ssp.errors import UsageError
from neuron_ssp.topology import (
    INSTANCES,
    DeploymentPlan,
    hourly_price_usd,
    plan_all_instances,
    plan_deployment,
)
from neuron_ssp.topology.catalog import GIB, PRICE_FROM_NEURON_DOCS
from neuron_ssp.topology.costs import cost_per_million_tokens
from neuron_ssp.topology.memory import HEADROOM_FRACTION, footprint
from neuron_ssp.topology.models import ARCHITECTURES, architecture_for_name, resolve_architecture
from neuron_ssp.topology.placement import CoreSet, busiest_core_bytes, load_order, visible_cores


def _plan(**kwargs: Any) -> DeploymentPlan:
    return plan_deployment(config_from_dict(neuron_pair(**kwargs)))


# ---------------------------------------------------------------- the AWS ML Blog post's worked example


def test_bf16_70b_needs_more_than_10_cores_and_tp16_on_trn1() -> None:
    plan = _plan(dtype="bf16")
    target, draft = plan.models["target"], plan.models["draft"]
    assert 10 < target.cores_needed < 11
    assert target.smallest_fitting_tp == 16  # Trn1 accepts 1, 2, 8, 16, 32: 16 is the first above 10
    assert 1 < draft.cores_needed < 2 and draft.smallest_fitting_tp == 2
    assert plan.fitting_tp_degrees == [16, 32] and plan.recommended_tp == 32
    assert plan.fits


def test_fp32_70b_needs_more_than_18_cores_so_the_7b_reuses_the_same_32() -> None:
    plan = _plan(dtype="fp32")
    target, draft = plan.models["target"], plan.models["draft"]
    assert target.cores_needed > 18 and target.smallest_fitting_tp == 32
    assert draft.cores_needed > 2
    assert plan.fitting_tp_degrees == [32]
    assert str(target.cores) == str(draft.cores) == "0-31" == plan.visible_cores
    assert plan.fits


def test_blog_totals_with_buffers_lie_between_bare_weights_and_our_headroom() -> None:
    """AWS ML Blog post: 70B + 7B need almost 200 GB in bf16 and ~360 GB in fp32 with buffers. Our 25 %
    headroom is at least as cautious: bare weights + KV < the blog's total <= ours."""
    for dtype, blog_total in (("bf16", 200e9), ("fp32", 360e9)):
        models = _plan(dtype=dtype).models.values()
        bare = sum(m.footprint.weight_bytes + m.footprint.kv_bytes for m in models)
        assert bare < blog_total <= bare / (1 - HEADROOM_FRACTION), (dtype, bare / 1e9)


def test_plan_exposes_what_the_neuron_backend_reads() -> None:
    plan = _plan()
    assert plan.load_order == ["target", "draft"]
    assert plan.visible_cores == "0-31"
    assert (plan.models["draft"].first_core, plan.models["draft"].tp_degree) == (0, 32)
    assert json.loads(json.dumps(plan.to_dict()))["models"]["target"]["cores"] == "0-31"


def test_cost_defaults_to_the_published_latency() -> None:
    plan = _plan()
    assert plan.ms_per_token == 20.6 and plan.cost_per_hour == 21.50
    assert plan.cost_per_million_tokens == pytest.approx(21.50 * 20.6 / 3.6)
    given = plan_deployment(config_from_dict(neuron_pair()), ms_per_token=10.0)
    assert given.cost_per_million_tokens == pytest.approx(21.50 * 10 / 3.6)
    unknown = plan_deployment(config_from_dict(neuron_pair(target=LLAMA3_70B, draft="/m/llama-3-8b")), "inf2.48xlarge")
    assert unknown.cost_per_million_tokens is None and "--ms-per-token" in unknown.ms_per_token_source


def test_all_instances_says_which_can_host_the_pair() -> None:
    hosts = {p.instance.name: p.recommended_tp for p in plan_all_instances(config_from_dict(neuron_pair()))}
    assert hosts["trn1.32xlarge"] == 32 and hosts["inf2.48xlarge"] == 24
    assert hosts["trn1.2xlarge"] is None and hosts["inf2.xlarge"] is None
    assert hosts["trn2.48xlarge"] is None  # not a transformers-neuronx target


def test_plan_needs_an_instance_and_a_known_model() -> None:
    with pytest.raises(UsageError) as caught:
        plan_deployment(load_config())
    assert caught.value.problems[0].field == "platform.instance_type"
    with pytest.raises(UsageError) as caught:
        plan_deployment(config_from_dict(merged(neuron_pair(), target={"path": "/x"}, draft={"path": "/y"})))
    assert [p.field for p in caught.value.problems] == ["target.path", "draft.path"]


def test_plan_of_cores_past_the_instance_does_not_fit() -> None:
    plan = plan_deployment(config_from_dict(neuron_pair(dtype="fp32")), "inf2.48xlarge")
    assert not plan.within_instance and not plan.fits


# ---------------------------------------------------------------- memory arithmetic


def test_kv_heads_are_replicated_per_core() -> None:
    llama70 = ARCHITECTURES["llama-2-70b"]
    at8 = footprint(llama70, "bf16", 8, 1, 1)
    at32 = footprint(llama70, "bf16", 32, 1, 1)
    per_head = 2 * 80 * 128 * 2
    assert at8.kv_bytes_per_core == per_head  # 8 kv heads over 8 cores: one each
    assert at32.kv_bytes_per_core == per_head  # 32 cores: still one each, i.e. replicated 4x
    assert at32.kv_bytes == 8 * per_head


def test_footprint_scales_with_positions_batch_and_dtype() -> None:
    llama7 = ARCHITECTURES["llama-2-7b"]
    base = footprint(llama7, "bf16", 2, 2048, 1)
    assert footprint(llama7, "bf16", 2, 4096, 1).kv_bytes_per_core == 2 * base.kv_bytes_per_core
    assert footprint(llama7, "bf16", 2, 2048, 2).kv_bytes_per_core == 2 * base.kv_bytes_per_core
    assert footprint(llama7, "fp32", 2, 2048, 1).weight_bytes == 2 * base.weight_bytes
    assert base.weight_bytes_per_core == llama7.params  # 2 bytes x params / tp 2


def test_busiest_core_adds_up_models_that_share_it() -> None:
    sizes = {"target": 5, "draft": 2}
    assert busiest_core_bytes({"target": CoreSet(0, 32), "draft": CoreSet(0, 32)}, sizes) == 7
    assert busiest_core_bytes({"target": CoreSet(0, 16), "draft": CoreSet(16, 16)}, sizes) == 5
    assert busiest_core_bytes({"target": CoreSet(0, 16), "draft": CoreSet(8, 16)}, sizes) == 7


def test_placement_relations_order_and_visible_cores() -> None:
    assert CoreSet(0, 32).relation(CoreSet(0, 32)) == "identical"
    assert CoreSet(0, 16).relation(CoreSet(16, 16)) == "disjoint"
    assert CoreSet(0, 16).relation(CoreSet(8, 16)) == "partial"
    assert load_order({"draft": CoreSet(0, 32), "target": CoreSet(0, 32)}) == ["target", "draft"]
    assert load_order({"target": CoreSet(16, 16), "draft": CoreSet(0, 16)}) == ["draft", "target"]
    assert visible_cores({"target": CoreSet(16, 16)}) == "16-31"
    assert visible_cores({"target": CoreSet(3, 1)}) == "3"


# ---------------------------------------------------------------- catalogs


def test_instance_catalog_matches_design() -> None:
    assert {n: (i.neuron_cores, i.hbm_per_core_gib) for n, i in INSTANCES.items()} == {
        "inf2.xlarge": (2, 16),
        "inf2.8xlarge": (2, 16),
        "inf2.24xlarge": (12, 16),
        "inf2.48xlarge": (24, 16),
        "trn1.2xlarge": (2, 16),
        "trn1.32xlarge": (32, 16),
        "trn1n.32xlarge": (32, 16),
        "trn2.48xlarge": (64, 24),
    }
    assert INSTANCES["trn1.32xlarge"].hbm_per_core_bytes == 16 * GIB
    assert {n for n, i in INSTANCES.items() if i.price_source == PRICE_FROM_NEURON_DOCS} == {
        "inf2.48xlarge",
        "trn1.32xlarge",
    }
    assert hourly_price_usd("TRN1.32xlarge") == 21.50 and hourly_price_usd("p5.48xlarge") is None
    assert cost_per_million_tokens(3.6, 1.0) == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("path", "name"),
    [
        ("/opt/models/Llama-2-70b-hf", "llama-2-70b"),
        ("/opt/models/Llama-2-7b-chat-hf/", "llama-2-7b"),
        ("/opt/models/llama2_13b", "llama-2-13b"),
        ("/opt/models/Meta-Llama-3-8B-Instruct", "llama-3-8b"),
        ("/opt/models/Meta-Llama-3.1-70B-Instruct", "llama-3.1-70b"),
        ("/opt/models/Llama-3.3-70B-Instruct", "llama-3.3-70b"),
        ("/opt/models/Llama-3.2-1B-Instruct", "llama-3.2-1b"),
        ("/opt/models/Llama-3.4-70B", None),
        ("/opt/models/llama-2-70bx", None),
        ("/opt/models/mistral-7b", None),
    ],
)
def test_directory_names_map_to_the_catalog(path: str, name: str | None) -> None:
    found = architecture_for_name(path)
    assert (found.name if found else None) == name


def test_catalog_shapes_match_design() -> None:
    shapes = {
        n: (a.layers, a.hidden, a.heads, a.kv_heads, a.vocab, round(a.params / 1e9, 2))
        for n, a in ARCHITECTURES.items()
    }
    assert shapes["llama-2-70b"] == (80, 8192, 64, 8, 32000, 68.98)
    assert shapes["llama-2-7b"] == (32, 4096, 32, 32, 32000, 6.74)
    assert shapes["llama-3-8b"] == (32, 4096, 32, 8, 128256, 8.03)
    assert shapes["llama-3-70b"] == (80, 8192, 64, 8, 128256, 70.55)
    assert shapes["smollm2-135m-instruct"] == (30, 576, 9, 3, 49152, 0.13)


def test_embedded_default_uses_catalog_numbers_without_loading() -> None:
    architecture = resolve_architecture(load_config().target, "target")
    assert architecture.name == "smollm2-135m-instruct"
    assert architecture.params == pytest.approx(134.5e6, rel=1e-3)


@pytest.mark.parametrize("name", ["llama-2-7b", "llama-3-70b", "smollm2-135m-instruct"])
def test_config_json_parameter_count_matches_catalog(tmp_path: Any, name: str) -> None:
    known = ARCHITECTURES[name]
    intermediate = {"llama-2-7b": 11008, "llama-3-70b": 28672, "smollm2-135m-instruct": 1536}[name]
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "num_hidden_layers": known.layers,
                "hidden_size": known.hidden,
                "num_attention_heads": known.heads,
                "num_key_value_heads": known.kv_heads,
                "vocab_size": known.vocab,
                "intermediate_size": intermediate,
                "tie_word_embeddings": name.startswith("smollm2"),
            }
        )
    )
    read = resolve_architecture(ModelConfig(path=str(tmp_path)), "target")
    assert (read.params, read.head_dim, read.vocab) == (known.params, known.head_dim, known.vocab)
    assert read.source.endswith("config.json")


def test_config_json_named_like_a_catalog_entry_keeps_the_catalog_name(tmp_path: Any) -> None:
    model_dir = tmp_path / "Llama-2-7b-hf"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(
        json.dumps(
            {
                "num_hidden_layers": 32,
                "hidden_size": 4096,
                "num_attention_heads": 32,
                "vocab_size": 32001,
                "intermediate_size": 11008,
            }
        )
    )
    read = resolve_architecture(ModelConfig(path=str(model_dir)), "draft")
    assert read.name == "llama-2-7b" and read.vocab == 32001  # the file wins over the name


def test_directory_without_config_json_falls_back_to_the_name() -> None:
    assert resolve_architecture(ModelConfig(path=LLAMA2_7B), "draft").name == "llama-2-7b"
