"""The Neuron backend through the stand-in: call order, arguments, cache_ids, output equal to plain greedy."""

from __future__ import annotations

import warnings
from pathlib import Path
from types import ModuleType

import pytest
import torch
from neuron_support import VOCAB, check_self_draft_accepts_everything, neuron_config, prompt, speculative
from transformers import LlamaForCausalLM

from neuron_ssp.backends.base import ModelBackend
from neuron_ssp.backends.neuron.api import SUPPORTED, load_neuronx
from neuron_ssp.backends.neuron.load import load_neuron_backends
from neuron_ssp.backends.torch.load import dtype_kwarg
from neuron_ssp.config import Config
from neuron_ssp.drafters import ModelDrafter
from neuron_ssp.engines.base import sampling_params
from neuron_ssp.engines.native import SpeculativeGenerator, plain_generate
from neuron_ssp.errors import RuntimeProblem, UsageError
from neuron_ssp.speculation.acceptors import GreedyAcceptor, ProbabilisticAcceptor
from neuron_ssp.speculation.call_cost import target_cost
from neuron_ssp.speculation.policies import build_policy
from neuron_ssp.topology import plan_deployment, validate_config
from neuron_ssp.topology.batch_rules import TNX_0_13
from neuron_ssp.topology.parallelism import KV_PADDING, KV_REPLICATED_TO_HEADS

pytest_plugins = ["neuron_fixtures"]  # fixtures: neuronx, neuronx_any, neuronx_commit, tiny_model_dirs


def load(config: Config):
    return load_neuron_backends(config, plan_deployment(config))


def events(standin: ModuleType, call: str | None = None) -> list[tuple[str, str, dict]]:
    return [e for e in standin.RUNTIME.events if call is None or e[1] == call]


# ---------------------------------------------------------------- loading


def test_loads_in_plan_order_with_speculation_enabled_before_to_neuron(
    neuronx_any: ModuleType, tiny_model_dirs: dict[str, Path]
) -> None:
    config = neuron_config(tiny_model_dirs["target"], tiny_model_dirs["draft"])
    target, draft = load(config)
    lifecycle = [
        (model, call)
        for model, call, _ in neuronx_any.RUNTIME.events
        if call in ("from_pretrained", "enable_speculative_decoder", "to_neuron")
    ]
    assert plan_deployment(config).load_order == ["target", "draft"]
    assert lifecycle == [
        ("tiny-target", "from_pretrained"),
        ("tiny-target", "enable_speculative_decoder"),
        ("tiny-target", "to_neuron"),
        ("tiny-draft", "from_pretrained"),
        ("tiny-draft", "to_neuron"),
    ]
    ((_, _, enabled),) = events(neuronx_any, "enable_speculative_decoder")
    expected_batch = None if neuronx_any.API == "sdk_2_18" else 1
    assert enabled == {"speculation_length": 4, "batch_sizes": expected_batch}
    assert isinstance(target, ModelBackend) and isinstance(draft, ModelBackend)
    assert (target.max_score_width, draft.max_score_width) == (4, 1)
    assert (target.vocab_size, target.n_positions) == (VOCAB, 128)


def test_passes_only_the_allow_listed_constructor_arguments(
    neuronx: ModuleType, tiny_model_dirs: dict[str, Path]
) -> None:
    config = neuron_config(
        tiny_model_dirs["target"], tiny_model_dirs["draft"], target={"dtype": "bf16"}, draft={"dtype": "fp16"}
    )
    target, draft = load(config)
    calls = {model: details for model, call, details in events(neuronx, "from_pretrained")}
    assert calls["tiny-target"] == {"n_positions": 128, "batch_size": 1, "amp": "bf16", "tp_degree": 2}
    assert calls["tiny-draft"] == {"n_positions": 128, "batch_size": 1, "amp": "f16", "tp_degree": 2}
    assert target.model.ignored_kwargs == {} and draft.model.ignored_kwargs == {}


def test_sets_visible_cores_from_the_plan_before_the_runtime_starts(
    neuronx: ModuleType, tiny_model_dirs: dict[str, Path]
) -> None:
    config = neuron_config(tiny_model_dirs["target"], target={"first_core": 2}, neuron={"compile_cache_url": "/tmp/cc"})
    load(config)
    assert neuronx.RUNTIME.visible == [2, 3]
    import os

    assert os.environ["NEURON_COMPILE_CACHE_URL"] == "/tmp/cc"


def test_refuses_a_visible_cores_setting_that_contradicts_the_plan(
    neuronx: ModuleType, tiny_model_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NEURON_RT_VISIBLE_CORES", "8-15")
    with pytest.raises(UsageError, match="NEURON_RT_VISIBLE_CORES"):
        load(neuron_config(tiny_model_dirs["target"]))
    assert events(neuronx) == []


def test_a_partial_core_overlap_fails_on_the_topology_rule_before_any_load(
    neuronx: ModuleType, tiny_model_dirs: dict[str, Path]
) -> None:
    config = neuron_config(tiny_model_dirs["target"], tiny_model_dirs["draft"], draft={"tp_degree": 4})
    with pytest.raises(UsageError) as error:
        load(config)
    assert any(p.field == "draft.tp_degree" and "same cores" in p.rule for p in error.value.problems)
    assert events(neuronx) == []  # the stand-in runtime, which would raise on the overlap, was never reached


def test_without_transformers_neuronx_says_what_to_install(tiny_model_dirs: dict[str, Path]) -> None:
    with pytest.raises(RuntimeProblem) as error:
        load(neuron_config(tiny_model_dirs["target"]))
    fix = error.value.problems[0].fix
    assert "transformers-neuronx" in error.value.problems[0].rule
    assert "https://pip.repos.neuron.amazonaws.com" in fix and "/opt/aws_neuronx_venv_pytorch_2_7_transformers" in fix


def test_without_a_device_says_so(
    neuronx: ModuleType, tiny_model_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr("neuron_ssp.backends.neuron.env.DEV_GLOB", str(tmp_path / "nothing" / "neuron*"))
    with pytest.raises(RuntimeProblem, match="no Neuron device"):
        load(neuron_config(tiny_model_dirs["target"]))


def test_an_api_without_what_we_call_is_refused_naming_the_supported_versions(
    neuronx: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers_neuronx.llama.model import LlamaForSampling

    monkeypatch.delattr(LlamaForSampling, "speculative_forward")
    with pytest.raises(RuntimeProblem) as error:
        load_neuronx()
    assert "speculative_forward" in error.value.problems[0].rule and SUPPORTED in error.value.problems[0].rule


def test_an_unknown_version_with_matching_signatures_warns(
    neuronx: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    import transformers_neuronx

    monkeypatch.setattr(transformers_neuronx, "__version__", "0.14.1")
    with pytest.warns(UserWarning, match="outside the tested range"):
        api = load_neuronx()
    assert api.generation == TNX_0_13


def test_tells_each_commit_by_what_it_does(neuronx_commit: ModuleType) -> None:
    api = load_neuronx()
    commit = neuronx_commit.COMMIT
    assert api.generation == f"tnx-{commit}" and api.version == neuronx_commit.COMMITS[commit]
    assert api.speculation_takes_batch_sizes == (commit != "7a30b42")
    assert (api.window_kept is None) == (commit in ("c8d6bdc", "1ade6d7"))  # probe.py: 0623de2 rewrites them
    assert api.loop_takes_attention_mask == api.batched_acceptor == (commit == "1ade6d7")
    # 0.10 has no utils.get_qkv_padding: it replicates kv heads up to the query heads
    assert api.kv_rule == (KV_PADDING if commit in ("c8d6bdc", "1ade6d7") else KV_REPLICATED_TO_HEADS)


def test_a_gqa_target_that_fits_only_with_0_11_padding_is_refused_on_0_10(
    neuronx_any: ModuleType, tiny_model_dirs: dict[str, Path]
) -> None:
    """Llama-3-70B at tp 32: 0.11+ holds 32 kv heads (one per core), 0.10 holds 64 (two per core), so a
    long cache that fits the first does not fit the second; the load says so before compiling."""
    config = neuron_config(
        tiny_model_dirs["target"],
        target={"architecture": "llama-3-70b", "tp_degree": 32, "n_positions": 150_000, "dtype": "bf16"},
    )
    assert validate_config(config).ok
    if neuronx_any.API == "sdk_2_21":
        load_neuron_backends(
            config.model_copy(update={"neuron": config.neuron.model_copy(update={"self_test": False})}),
            plan_deployment(config),
        )
        return
    with pytest.raises(UsageError) as caught:
        load_neuron_backends(config, plan_deployment(config))
    (problem,) = caught.value.problems
    assert problem.field == "target.tp_degree"
    assert "8 kv heads replicated to 64 by transformers-neuronx 0.10" in problem.rule
    assert "0.11+" in problem.fix
    assert neuronx_any.RUNTIME.calls() == []  # nothing loaded


# ---------------------------------------------------------------- scoring


def reference_logits(model_dir: Path, tokens: list[int]) -> torch.Tensor:
    model = LlamaForCausalLM.from_pretrained(str(model_dir), **{dtype_kwarg(): torch.float32}).eval()
    with torch.inference_mode():
        return torch.stack([model(input_ids=torch.tensor([tokens[: i + 1]])).logits[0, -1] for i in range(len(tokens))])


def test_prefill_and_score_shapes_cache_ids_and_values(neuronx: ModuleType, tiny_model_dirs: dict[str, Path]) -> None:
    target, _ = load(neuron_config(tiny_model_dirs["target"]))
    ids = prompt(6)
    window = torch.tensor([11, 12, 13])
    neuronx.RUNTIME.events.clear()
    last = target.prefill(ids)
    one = target.score(torch.tensor([10]), 6)
    rows = target.score(window, 7)  # 3 < k=4: padded window
    assert last.shape == (VOCAB,) and one.shape == (1, VOCAB) and rows.shape == (3, VOCAB)
    assert all(t.dtype == torch.float32 for t in (last, one, rows))
    sent = [(call, details["cache_ids"], details["input_ids"]) for _, call, details in neuronx.RUNTIME.events]
    assert sent == [
        ("forward", None, ids.tolist()),
        ("forward", [6], [10]),
        ("speculative_forward", [7, 8, 9, 10], [11, 12, 13, 13]),
    ]
    expected = reference_logits(tiny_model_dirs["target"], ids.tolist() + [10, 11, 12, 13])
    assert torch.allclose(last, expected[5], atol=1e-5)
    assert torch.allclose(one[0], expected[6], atol=1e-5)
    assert torch.allclose(rows, expected[7:10], atol=1e-5)


def test_a_window_wider_than_k_is_scored_in_compiled_chunks(
    neuronx: ModuleType, tiny_model_dirs: dict[str, Path]
) -> None:
    target, _ = load(neuron_config(tiny_model_dirs["target"]))
    target.prefill(prompt(6))
    neuronx.RUNTIME.events.clear()
    rows = target.score(torch.arange(20, 26), 6)
    assert rows.shape == (6, VOCAB)
    assert [(call, d["cache_ids"]) for _, call, d in neuronx.RUNTIME.events] == [
        ("speculative_forward", [6, 7, 8, 9]),
        ("speculative_forward", [10, 11, 12, 13]),
    ]


def test_the_draft_scores_one_token_per_call(neuronx: ModuleType, tiny_model_dirs: dict[str, Path]) -> None:
    _, draft = load(neuron_config(tiny_model_dirs["target"], tiny_model_dirs["draft"]))
    draft.prefill(prompt(6))
    neuronx.RUNTIME.events.clear()
    assert draft.score(torch.tensor([30, 31]), 6).shape == (2, VOCAB)
    assert [(call, d["cache_ids"]) for _, call, d in neuronx.RUNTIME.events] == [
        ("forward", [6]),
        ("forward", [7]),
    ]


def test_a_window_without_room_to_pad_is_decoded_token_by_token(
    neuronx: ModuleType, tiny_model_dirs: dict[str, Path]
) -> None:
    target, _ = load(neuron_config(tiny_model_dirs["target"]))
    target.prefill(torch.arange(125) % 90 + 3)  # slots 0..124 of 0..127
    neuronx.RUNTIME.events.clear()
    assert target.score(torch.tensor([5, 6]), 125).shape == (2, VOCAB)  # a k=4 window would need slot 128
    assert [(call, d["cache_ids"]) for _, call, d in neuronx.RUNTIME.events] == [
        ("forward", [125]),
        ("forward", [126]),
    ]


def test_scoring_past_the_compiled_positions_is_refused(neuronx: ModuleType, tiny_model_dirs: dict[str, Path]) -> None:
    target, _ = load(neuron_config(tiny_model_dirs["target"]))
    with pytest.raises(RuntimeProblem, match="n_positions"):
        target.score(torch.tensor([1, 2]), 127)


# ---------------------------------------------------------------- the generator on Neuron backends


@pytest.mark.parametrize("policy", ["fixed", "adaptive", "draft-confidence"])
def test_greedy_speculative_output_equals_plain_greedy(
    neuronx: ModuleType, tiny_model_dirs: dict[str, Path], policy: str
) -> None:
    config = neuron_config(
        tiny_model_dirs["target"], tiny_model_dirs["draft"], speculation={"policy": policy, "k_min": 2}
    )
    target, draft = load(config)
    ids = prompt(7)
    plain = plain_generate(target, ids, 24, config.sampling)
    for acceptor in (GreedyAcceptor(), ProbabilisticAcceptor(sampling_params(config.sampling))):
        ssp = speculative(config, target, draft, acceptor).generate(ids, 24)
        assert ssp.tokens == plain.tokens


def test_draft_equal_to_target_accepts_every_draft(neuronx: ModuleType, tiny_model_dirs: dict[str, Path]) -> None:
    config = neuron_config(tiny_model_dirs["target"], tiny_model_dirs["target"])
    target, draft = load(config)
    check_self_draft_accepts_everything(config, target, draft)


def test_cache_ids_sent_at_every_step(neuronx: ModuleType, tiny_model_dirs: dict[str, Path]) -> None:
    config = neuron_config(tiny_model_dirs["target"], tiny_model_dirs["draft"])
    target, draft = load(config)
    neuronx.RUNTIME.events.clear()
    ids = prompt(7)
    committed = [len(ids)]
    marks: list[tuple[int, int]] = []  # (events so far, tokens committed) after every commit

    def on_tokens(tokens: list[int]) -> None:
        committed[0] += len(tokens)
        marks.append((len(neuronx.RUNTIME.events), committed[0]))

    speculative(config, target, draft, GreedyAcceptor()).generate(ids, 24, on_tokens=on_tokens)
    target_calls = [
        (i, call, d["cache_ids"]) for i, (model, call, d) in enumerate(neuronx.RUNTIME.events) if model == "tiny-target"
    ]
    assert target_calls[0][1:] == ("forward", None)  # context encoding of the prompt
    for index, call, cache_ids in target_calls[1:]:
        length = max(n for seen, n in marks if seen <= index)
        if call == "forward":  # a window of 1 (one token left to generate): plain decoding
            assert cache_ids == [length - 1]
        else:  # the last committed token + 3 draft slots (padded when fewer were drafted)
            assert (call, cache_ids) == ("speculative_forward", list(range(length - 1, length + 3)))
    draft_slots = [d["cache_ids"] for model, call, d in neuronx.RUNTIME.events if model == "tiny-draft"]
    assert draft_slots[0] is None and all(len(slots) == 1 for slots in draft_slots[1:])


def test_sampling_runs_and_is_reproducible(neuronx: ModuleType, tiny_model_dirs: dict[str, Path]) -> None:
    config = neuron_config(
        tiny_model_dirs["target"],
        tiny_model_dirs["draft"],
        sampling={"temperature": 0.8, "seed": 5},
        speculation={"acceptor": "probabilistic"},
    )
    target, draft = load(config)
    rng = torch.Generator()
    acceptor = ProbabilisticAcceptor(sampling_params(config.sampling), rng)
    generator = SpeculativeGenerator(
        target,
        ModelDrafter(draft, sampling_params(config.sampling), rng),
        acceptor,
        build_policy(config.speculation, target_cost(target, 4)),
        config.sampling,
        4,
        rng,
    )
    first, second = generator.generate(prompt(7), 20), generator.generate(prompt(7), 20)
    assert first.tokens == second.tokens and len(first.tokens) == 20


def test_ngram_drafter_on_a_neuron_target(neuronx: ModuleType, tiny_model_dirs: dict[str, Path]) -> None:
    config = neuron_config(tiny_model_dirs["target"])
    target, draft = load(config)
    assert draft is None
    ids = torch.tensor([5, 6, 7, 8, 5, 6, 7, 8, 5, 6])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ssp = speculative(config, target, None, GreedyAcceptor()).generate(ids, 20)
    assert ssp.tokens == plain_generate(target, ids, 20, config.sampling).tokens


def test_a_score_past_the_compiled_positions_names_the_model_the_slots_and_the_fix() -> None:
    """Checked before the model is called (a model that would be called fails the test): the model's field, its
    compiled positions, the slots asked for and what to change."""
    from neuron_ssp.backends.neuron.scoring import NeuronBackend

    backend = NeuronBackend(object(), "draft", VOCAB, 16, 4)
    with pytest.raises(RuntimeProblem) as caught:
        backend.score(torch.tensor([1, 2, 3, 4]), 14)
    (problem,) = caught.value.problems
    assert problem.field == "draft.n_positions" and problem.value == 16
    assert problem.rule == "scoring cache slots 14..17 runs past the compiled positions"
    assert problem.fix == "raise draft.n_positions (and recompile) or lower generation.max_new_tokens"
