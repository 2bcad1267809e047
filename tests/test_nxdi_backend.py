"""The NxDI backend on the real NxD Inference code (CPU mode): inputs NxDI receives, logits against Hugging Face,
greedy speculative output equal to plain greedy, rollback after a rejection, compile/load bookkeeping.

Runs in .venv-nxdi (`bash .ci/nxdi.sh`); skips elsewhere with the reason (tests/nxdi_fixtures.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from neuron_support import VOCAB, check_self_draft_accepts_everything, prompt, speculative
from nxdi_support.configs import nxdi_config
from nxdi_support.recording import recorded_forward
from transformers import LlamaForCausalLM

from neuron_ssp.engines.base import sampling_params
from neuron_ssp.engines.native import plain_generate
from neuron_ssp.errors import RuntimeProblem, UsageError
from neuron_ssp.speculation.acceptors import GreedyAcceptor, ProbabilisticAcceptor
from neuron_ssp.topology import plan_deployment

pytest_plugins = ["neuron_fixtures", "nxdi_fixtures"]  # tiny_model_dirs; nxdi


def load(config: Any) -> tuple[Any, Any]:
    from neuron_ssp.backends.nxdi.load import load_nxdi_backends

    return load_nxdi_backends(config, plan_deployment(config))


def reference_logits(model_dir: Path, tokens: list[int]) -> torch.Tensor:
    model = LlamaForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    with torch.inference_mode():
        return model(input_ids=torch.tensor([tokens])).logits[0]


def test_inputs_follow_nxdi_rules_and_logits_match_hugging_face(nxdi: Any, tiny_model_dirs: dict[str, Path]) -> None:
    target, _ = load(nxdi_config(tiny_model_dirs["target"], neuron={"self_test": False}))
    calls = recorded_forward(target.app)
    ids = prompt(6)
    last = target.prefill(ids)
    rows = target.score(torch.tensor([11, 12, 13]), 6)  # 3 < k = 4: padded to k
    one = target.score(torch.tensor([14]), 9)
    assert [(c["input_ids"], c["position_ids"], len(c["attention_mask"][0]), c["seq_ids"]) for c in calls] == [
        ([ids.tolist()], [list(range(6))], 6, [0]),
        ([[11, 12, 13, 13]], [[6, 7, 8, 9]], 6, [0]),  # the mask covers the committed slots 0..5 only
        ([[14, 14, 14, 14]], [[9, 10, 11, 12]], 9, [0]),  # every target call is k wide (no token-gen model)
    ]
    assert all(set(map(int, sum(c["attention_mask"], []))) == {1} for c in calls)
    expected = reference_logits(tiny_model_dirs["target"], ids.tolist() + [11, 12, 13, 14])
    assert last.shape == (VOCAB,) and rows.shape == (3, VOCAB) and one.shape == (1, VOCAB)
    assert torch.allclose(last, expected[5], atol=1e-5)
    assert torch.allclose(rows, expected[6:9], atol=1e-5)
    assert torch.allclose(one[0], expected[9], atol=1e-5)


def test_rollback_a_rejected_suffix_is_overwritten_by_the_next_call(
    nxdi: Any, tiny_model_dirs: dict[str, Path]
) -> None:
    """Score a window, 'reject' all but its first token, score another continuation from slot start+1: the
    logits equal a cache that never saw the rejected tokens (NxDI masks slots >= start and scatters the new
    keys/values at position_ids)."""
    target, _ = load(nxdi_config(tiny_model_dirs["target"], neuron={"self_test": False}))
    ids = prompt(8)
    target.prefill(ids)
    target.score(torch.tensor([20, 21, 22, 23]), 8)  # slots 8..11; 21..23 are then rejected
    after = target.score(torch.tensor([30, 31, 32, 33]), 9)  # overwrites slots 9..12
    expected = reference_logits(tiny_model_dirs["target"], ids.tolist() + [20, 30, 31, 32, 33])
    assert torch.allclose(after, expected[9:13], atol=1e-5)


def test_the_draft_scores_one_token_per_call(nxdi: Any, tiny_model_dirs: dict[str, Path]) -> None:
    _, draft = load(nxdi_config(tiny_model_dirs["target"], tiny_model_dirs["draft"], neuron={"self_test": False}))
    calls = recorded_forward(draft.app)
    draft.prefill(prompt(6))
    rows = draft.score(torch.tensor([30, 31]), 6)
    assert rows.shape == (2, VOCAB) and draft.max_score_width == 1
    assert [(c["position_ids"], len(c["attention_mask"][0])) for c in calls[1:]] == [([[6]], 6), ([[7]], 7)]


@pytest.mark.parametrize("policy", ["fixed", "adaptive", "draft-confidence"])
def test_greedy_speculative_output_equals_plain_greedy(
    nxdi: Any, tiny_model_dirs: dict[str, Path], policy: str
) -> None:
    config = nxdi_config(
        tiny_model_dirs["target"],
        tiny_model_dirs["draft"],
        speculation={"policy": policy, "k_min": 2},
        neuron={"self_test": False},
    )
    target, draft = load(config)
    ids = prompt(7)
    plain = plain_generate(target, ids, 24, config.sampling)
    reference = LlamaForCausalLM.from_pretrained(str(tiny_model_dirs["target"]), dtype=torch.float32).eval()
    with torch.inference_mode():
        hf = reference.generate(ids.view(1, -1), max_new_tokens=24, do_sample=False, min_new_tokens=24)
    assert plain.tokens == hf[0, 7:].tolist()
    for acceptor in (GreedyAcceptor(), ProbabilisticAcceptor(sampling_params(config.sampling))):
        assert speculative(config, target, draft, acceptor).generate(ids, 24).tokens == plain.tokens


def test_draft_equal_to_target_accepts_every_draft(nxdi: Any, tiny_model_dirs: dict[str, Path]) -> None:
    config = nxdi_config(tiny_model_dirs["target"], tiny_model_dirs["target"], neuron={"self_test": False})
    target, draft = load(config)
    check_self_draft_accepts_everything(config, target, draft)


def test_ngram_drafter_on_an_nxdi_target(nxdi: Any, tiny_model_dirs: dict[str, Path]) -> None:
    config = nxdi_config(tiny_model_dirs["target"], neuron={"self_test": False})
    target, _ = load(config)
    ids = torch.tensor([5, 6, 7, 8, 5, 6, 7, 8, 5, 6])
    ssp = speculative(config, target, None, GreedyAcceptor()).generate(ids, 20)
    assert ssp.tokens == plain_generate(target, ids, 20, config.sampling).tokens


def test_compiles_once_per_k_and_loads_on_the_plans_ranks(
    nxdi: Any, tiny_model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    store = str(tmp_path / "compiled")
    config = nxdi_config(
        tiny_model_dirs["target"], tiny_model_dirs["draft"], neuron={"compiled_dir": store, "self_test": False}
    )
    load(config)
    assert [(name, call) for name, call, _ in nxdi.DEVICE_CALLS] == [
        ("tiny-target", "compile"),
        ("tiny-target", "load"),
        ("tiny-draft", "compile"),
        ("tiny-draft", "load"),
    ]
    loads = [details for _, call, details in nxdi.DEVICE_CALLS if call == "load"]
    assert [(d["start_rank_id"], d["local_ranks_size"]) for d in loads] == [(0, 1), (0, 1)]
    nxdi.DEVICE_CALLS.clear()
    load(config)  # same settings: reused
    assert [call for _, call, _ in nxdi.DEVICE_CALLS] == ["load", "load"]
    nxdi.DEVICE_CALLS.clear()
    load(config.model_copy(update={"speculation": config.speculation.model_copy(update={"k": 5})}))
    assert [(name, call) for name, call, _ in nxdi.DEVICE_CALLS] == [
        ("tiny-target", "compile"),
        ("tiny-target", "load"),
        ("tiny-draft", "load"),
    ]  # a new k: the target only
    manifests = sorted(Path(store).rglob("neuron-ssp-artifact.json"))
    import json

    saved = [json.loads(p.read_text()) for p in manifests]
    targets = sorted(m["speculation_lengths"][0] for m in saved if m["role"] == "target")
    assert targets == [4, 5]
    assert all(m["library_version"].startswith("neuronx-distributed-inference 0.9") for m in saved)
    assert all(len(m["constructor"]["nxdi_config_sha256"]) == 64 for m in saved)


def test_one_target_holds_one_window(nxdi: Any, tiny_model_dirs: dict[str, Path]) -> None:
    target, _ = load(nxdi_config(tiny_model_dirs["target"], neuron={"self_test": False}))
    assert target.with_window(4) is target
    with pytest.raises(UsageError, match="one speculation model"):
        target.with_window(3)


def test_a_window_past_the_compiled_positions_is_refused(nxdi: Any, tiny_model_dirs: dict[str, Path]) -> None:
    target, _ = load(nxdi_config(tiny_model_dirs["target"], neuron={"self_test": False}))
    target.prefill(torch.arange(120) % 90 + 3)
    with pytest.raises(RuntimeProblem, match="k wide"):
        target.score(torch.tensor([5]), 125)  # a k = 4 window needs slots 125..128 of 0..127


def test_a_generation_without_room_for_the_last_k_wide_window_is_refused_up_front(
    nxdi: Any, tiny_model_dirs: dict[str, Path]
) -> None:
    """Our loop's last window starts at slot P+N-2; on NxDI it is k wide, so P+N-2+k slots, k-1 more than on
    a backend that scores narrower windows: refused before the first call, not half-way."""
    from neuron_ssp.engines.native import plain_generate

    target, _ = load(nxdi_config(tiny_model_dirs["target"], neuron={"self_test": False}))
    ids = prompt(8)
    config = nxdi_config(tiny_model_dirs["target"], neuron={"self_test": False})
    for generate in (
        lambda n: plain_generate(target, ids, n, config.sampling),
        lambda n: speculative(config, target, None, GreedyAcceptor()).generate(ids, n),
    ):
        with pytest.raises(UsageError, match="at least 131"):
            generate(121)  # 8 + 121 - 2 + 4 = 131 slots > 128
        assert len(generate(118).tokens) <= 118  # 8 + 118 - 2 + 4 = 128: fits


def test_only_the_expected_stubs_ran(nxdi: Any, tiny_model_dirs: dict[str, Path]) -> None:
    """The CPU path executes nothing closed-source beyond what the stubs give real values for."""
    from nxdi_support import stubs

    stubs.CALLS.clear()
    config = nxdi_config(tiny_model_dirs["target"], tiny_model_dirs["draft"], neuron={"self_test": False})
    target, draft = load(config)
    speculative(config, target, draft, GreedyAcceptor()).generate(prompt(7), 12)
    assert set(stubs.CALLS) <= {"torch_neuronx.get_platform_target", "neuronxcc.CollectivesConfig"}


def test_a_draft_nxdi_cannot_place_is_refused_before_anything_loads(
    nxdi: Any, tiny_model_dirs: dict[str, Path]
) -> None:
    """Both models of a process load from the first visible core; NxDI's start_rank_id is a multi-node rank offset
    (inference_demo.py:795), so a draft on other cores would get another rank's weights, never other cores."""
    config = nxdi_config(
        tiny_model_dirs["target"], tiny_model_dirs["draft"], draft={"first_core": 1}, neuron={"self_test": False}
    )
    with pytest.raises(UsageError) as error:
        load(config)
    assert [p.field for p in error.value.problems] == ["draft.first_core"]
    assert nxdi.DEVICE_CALLS == []


def test_prefill_runs_the_smallest_context_bucket_nxdi_builds_by_default(
    nxdi: Any, tiny_model_dirs: dict[str, Path]
) -> None:
    """Context encoding is bucketed as NxDI's own default would (autobucketing.generate_buckets(128, max context)):
    a 6-token prompt runs the 128 graph, not one padded to 256; decoding keeps one graph (n_positions)."""
    from neuronx_distributed_inference.modules.autobucketing import generate_buckets

    positions = {"n_positions": 256}
    config = nxdi_config(
        tiny_model_dirs["target"],
        tiny_model_dirs["draft"],
        target=positions,
        draft=positions,
        neuron={"self_test": False},
    )
    target, draft = load(config)
    for backend in (target, draft):
        assert backend.app.context_encoding_model.neuron_config.buckets == generate_buckets(128, 256) == [128, 256]
    assert target.app.speculation_model.neuron_config.buckets == [256]
    assert draft.app.token_generation_model.neuron_config.buckets == [256]
    widths = []
    cte = target.app.context_encoding_model
    real = cte._forward
    cte._forward = lambda *args: widths.append(args[0].shape[1]) or real(*args)
    ids = prompt(6)
    last = target.prefill(ids)
    assert widths == [128]
    assert torch.allclose(last, reference_logits(tiny_model_dirs["target"], ids.tolist())[5], atol=1e-5)
    reference = LlamaForCausalLM.from_pretrained(str(tiny_model_dirs["target"]), dtype=torch.float32).eval()
    with torch.inference_mode():
        hf = reference.generate(ids.view(1, -1), max_new_tokens=24, do_sample=False, min_new_tokens=24)
    assert speculative(config, target, draft, GreedyAcceptor()).generate(ids, 24).tokens == hf[0, 6:].tolist()
    assert widths == [128, 128]  # the speculative generation's prefill ran the same graph


def test_our_bucket_defaults_and_graph_counts_are_nxdis(nxdi: Any, tiny_model_dirs: dict[str, Path]) -> None:
    """`plan` and `compile` count one graph per bucket of each NxDI sub-model: held against the applications NxDI
    builds (ModelWrapper.neuron_config.buckets) for the native engine and for fused speculation."""
    from neuronx_distributed_inference.modules.autobucketing import generate_buckets

    from neuron_ssp.backends.nxdi.load import NxdiModels, fused_application, prepare_nxdi
    from neuron_ssp.topology.nxdi_graphs import default_buckets

    assert all(default_buckets(128, n) == generate_buckets(128, n) for n in range(16, 5000, 7))
    positions = {"n_positions": 256}
    for engine in ("native", "fused"):
        config = nxdi_config(
            tiny_model_dirs["target"],
            tiny_model_dirs["draft"],
            target=positions,
            draft=positions,
            speculation={"engine": engine},
            neuron={"nxdi": {"token_generation_buckets": [128, 256]}},
        )
        plan = plan_deployment(config)
        models = NxdiModels(config, plan, prepare_nxdi(config, plan))
        apps = (
            {"target": fused_application(models)[0]}
            if engine == "fused"
            else {role: models.application(role, 4 if role == "target" else 0)[0] for role in ("target", "draft")}
        )
        for role, app in apps.items():
            assert sum(len(wrapper.neuron_config.buckets) for wrapper in app.models) == plan.models[role].graphs.total
        assert plan.models["target"].graphs.total == 4  # 2 context + 2 decoding buckets; fused: the draft inside


def test_nxdi_takes_every_argument_of_the_tutorial_config(nxdi: Any) -> None:
    """configs/nxdi-llama33-70b-trn2-tutorial.yaml's NeuronConfig for both models, read back after NxDI built it
    (NeuronConfig only logs an argument it does not know)."""
    from neuron_ssp.backends.nxdi.api import load_nxdi
    from neuron_ssp.config import load_config

    api = load_nxdi("trn2")
    config = load_config(Path(__file__).parents[1] / "configs" / "nxdi-llama33-70b-trn2-tutorial.yaml")
    for role, k, fused in (("target", 7, True), ("draft", 0, False)):
        built = api.neuron_config(
            api.neuron_config_kwargs(config, role, k, fused=fused, lnc=2), {"do_sample": False, "top_k": 1}
        )
        assert (built.mlp_kernel_enabled, built.cc_pipeline_tiling_factor, built.max_context_length) == (True, 1, 12288)
