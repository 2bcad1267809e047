"""`engine: fused`: transformers-neuronx's FusedSpeculativeDecoder (stand-in of 1ade6d74) from our config."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest
import torch
from neuron_support import STANDIN, neuron_config, prompt, with_eos, with_tokenizer

from neuron_ssp.backends.neuron.load import load_neuron_backends
from neuron_ssp.backends.neuron.on_device import generation_settings
from neuron_ssp.backends.torch.load import TORCH_DTYPES
from neuron_ssp.config import SamplingConfig
from neuron_ssp.engines.fused import FusedEngine, fused_k
from neuron_ssp.engines.native import plain_generate
from neuron_ssp.errors import RuntimeProblem, UsageError
from neuron_ssp.pipeline.build import Shared
from neuron_ssp.pipeline.pipeline import Pipeline
from neuron_ssp.topology import plan_deployment, validate_config
from neuron_ssp.topology.engine_rules import DEVICE_LOGIT_BOUND, DTYPE_MAX
from neuron_ssp.topology.positions import max_new_tokens_within

pytest_plugins = ["neuron_fixtures"]  # fixtures: neuronx, neuronx_any, tiny_model_dirs
REAL = json.loads((STANDIN / "neuronx_signatures.json").read_text())["sdk_2_21_fused"]


def names(qualified: str) -> set[str]:
    return {p["name"] for p in REAL[qualified] if p["kind"] != "var_keyword"}


def fused_config(tiny_model_dirs: dict[str, Path], **sections):
    return neuron_config(
        tiny_model_dirs["target"],
        tiny_model_dirs["draft"],
        speculation={"engine": "fused", **sections.pop("speculation", {})},
        **sections,
    )


def test_the_k_mapping_is_our_window_minus_one() -> None:
    assert [fused_k(k) for k in (2, 4, 9)] == [1, 3, 8]


def test_greedy_output_equals_plain_greedy_and_stats_come_from_the_fused_loop(
    neuronx: ModuleType, tiny_model_dirs: dict[str, Path]
) -> None:
    config = fused_config(tiny_model_dirs)
    target, draft = load_neuron_backends(config, plan_deployment(config))
    engine = FusedEngine.build(config, target, draft)
    ids = prompt(7)
    result = engine.generate(ids, 24)

    native = neuron_config(tiny_model_dirs["target"], neuron={"self_test": False})
    plain_target, _ = load_neuron_backends(native, plan_deployment(native))
    assert result.tokens == plain_generate(plain_target, ids, 24, native.sampling).tokens

    ((_, _, built),) = [e for e in neuronx.RUNTIME.events if e[1] == "FusedSpeculativeDecoder"]
    assert built["k"] == config.speculation.k - 1  # the draft speculates k-1 tokens
    iterations = [d for _, c, d in neuronx.RUNTIME.events if c == "iteration"]
    assert iterations and all(len(d["window"]) == config.speculation.k for d in iterations)  # the target scores our k
    # the loop runs until its cache id reaches P+N, so a window may start at the last token (P+N-1): its tokens
    # are all past the budget, and it is not a call of the request's
    calls = [d for d in iterations if d["cache_id"] < len(ids) + 24 - 1]
    stats = result.stats
    assert stats.target_calls == len(calls)
    assert stats.draft_tokens == len(calls) * (config.speculation.k - 1)
    assert 0.0 <= stats.acceptance_rate <= 1.0 and stats.mean_accepted_length >= 1.0


def test_arguments_are_a_subset_of_the_real_signatures(neuronx: ModuleType, tiny_model_dirs: dict[str, Path]) -> None:
    config = fused_config(tiny_model_dirs)
    target, draft = load_neuron_backends(config, plan_deployment(config))
    FusedEngine.build(config, target, draft)
    ((_, _, built),) = [e for e in neuronx.RUNTIME.events if e[1] == "FusedSpeculativeDecoder"]
    assert set(built) <= names("FusedSpeculativeDecoder.__init__")
    settings = generation_settings(SamplingConfig(temperature=0.7, top_k=40, top_p=0.9), [2], 96)
    assert set(settings) <= names("GenerationConfig.__init__")
    assert {"on_device_embedding", "on_device_generation"} <= names("NeuronConfig.__init__")
    for model in (target.model, draft.model):
        assert model.neuron_config.on_device_embedding is True
        assert model.neuron_config.on_device_generation.do_sample is False
    loaded = [d for _, c, d in neuronx.RUNTIME.events if c == "from_pretrained"]
    assert all("neuron_config" in d for d in loaded)


def test_device_sampling_says_what_seed_and_top_k_0_mean(neuronx: ModuleType, tiny_model_dirs: dict[str, Path]) -> None:
    """top_k 0 is a full-vocabulary top-k per position, and sampling.seed does not reach the device's sampler:
    the warning says both (docs/neuron.md, engine fused, says so for the reader)."""
    config = fused_config(
        tiny_model_dirs, speculation={"acceptor": "probabilistic"}, sampling={"temperature": 0.8, "top_k": 0, "seed": 7}
    )
    target, draft = load_neuron_backends(config, plan_deployment(config))
    with pytest.warns(UserWarning) as caught:
        FusedEngine.build(config, target, draft)
    text = " ".join(str(w.message) for w in caught)
    assert "sampling.seed has no effect" in text and "whole vocabulary" in text
    assert target.model.neuron_config.on_device_generation.top_k == 96  # the vocabulary: nothing filtered
    assert "seed" not in names("GenerationConfig.__init__")  # nothing to pass it to


def test_models_that_generate_on_device_refuse_to_score(neuronx: ModuleType, tiny_model_dirs: dict[str, Path]) -> None:
    config = fused_config(tiny_model_dirs)
    target, _ = load_neuron_backends(config, plan_deployment(config))
    with pytest.raises(RuntimeProblem, match="token ids, not logits"):
        target.prefill(prompt(7))


def test_the_older_library_is_refused_cleanly(neuronx_any: ModuleType, tiny_model_dirs: dict[str, Path]) -> None:
    if neuronx_any.API != "sdk_2_18":
        pytest.skip("the 2.21 stand-in ships fused_speculation")
    config = fused_config(tiny_model_dirs)
    with pytest.raises(UsageError) as caught:  # the batch rules, keyed by what the installed build does
        load_neuron_backends(config, plan_deployment(config))
    (problem,) = caught.value.problems
    assert problem.field == "speculation.engine" and "0.13" in problem.fix
    assert "no FusedSpeculativeDecoder" in problem.rule and neuronx_any.RUNTIME.calls() == []


@pytest.mark.parametrize(
    ("sections", "field"),
    [
        ({"speculation": {"drafter": "ngram"}}, "speculation.drafter"),
        ({"speculation": {"policy": "adaptive"}}, "speculation.policy"),
        ({"speculation": {"acceptor": "typical"}}, "speculation.acceptor"),
        ({"speculation": {"acceptor": "my_module:MyAcceptor"}}, "speculation.acceptor"),
        ({"speculation": {"k": 10}}, "speculation.k"),
        ({"sampling": {"temperature": 0.8}}, "speculation.acceptor"),  # greedy would ignore it
        ({"draft": {"tp_degree": 8}}, "draft.tp_degree"),
        ({"generation": {"max_new_tokens": 110, "max_prompt_tokens": 24}}, "target.n_positions"),
        ({"draft": {"n_positions": 120}}, "draft.n_positions"),  # its cache is bound at the target's buckets
        ({"platform": {"backend": "torch"}}, "speculation.engine"),
    ],
)
def test_what_the_fused_decoder_cannot_do_is_refused_with_field_rule_fix(
    tiny_model_dirs: dict[str, Path], sections: dict, field: str
) -> None:
    config = fused_config(tiny_model_dirs, **sections)
    errors = validate_config(config).errors
    mine = [p for p in errors if p.field == field]
    assert mine, [str(p) for p in errors]
    assert all(p.rule and p.fix for p in mine)
    with pytest.raises(UsageError):
        validate_config(config).raise_if_invalid()


def test_the_device_loop_stops_at_the_id_the_chat_ends_with_and_flags_work_past_other_eos(
    neuronx: ModuleType, tiny_model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    """Llama-3-Instruct: the checkpoint's EOS ids are [128001, 128009], turns end with 128009. The device
    loop takes one id: the turn's end, not the first of the list."""
    turn_end = 17
    template = "{% for m in messages %}{{ m['role'] }} {{ m['content'] }} w17 {% endfor %}"
    target = with_eos(with_tokenizer(tiny_model_dirs["target"], tmp_path, template), [2, turn_end])
    config = neuron_config(target, tiny_model_dirs["draft"], speculation={"engine": "fused"})
    loaded_target, draft = load_neuron_backends(config, plan_deployment(config))
    engine = FusedEngine.build(config, loaded_target, draft)
    ((_, _, built),) = [e for e in neuronx.RUNTIME.events if e[1] == "FusedSpeculativeDecoder"]
    assert built["eos_token_id"] == turn_end and engine.decoder.eos_token_id == turn_end

    ids = prompt(7)
    full = engine.generate(ids, 24)
    assert full.stats.tokens_after_eos == 0
    other = next(t for t in full.tokens[3:] if t != turn_end)  # an EOS the device loop was not given
    cut = engine.generate(ids, 24, eos_token_ids={turn_end, other})
    assert cut.tokens == full.tokens[: full.tokens.index(other) + 1]
    assert cut.stats.tokens_after_eos == 24 - len(cut.tokens)  # the device ran on: flagged in the stats
    assert cut.stats.to_dict()["tokens_after_eos"] == cut.stats.tokens_after_eos


def test_the_servers_room_is_the_engines_room(neuronx: ModuleType, tiny_model_dirs: dict[str, Path]) -> None:
    """The largest max_tokens the server admits (Pipeline.check_room, its hint) runs; one more is refused
    by both, before any call (it was refused mid-way by the engine, a 500, when the two rules differed)."""
    config = fused_config(tiny_model_dirs)
    target, draft = load_neuron_backends(config, plan_deployment(config))
    engine = FusedEngine.build(config, target, draft)
    pipeline = Pipeline(config, None, target, draft, engine, set(), Shared())  # type: ignore[arg-type]
    ids = prompt(7)
    room = max_new_tokens_within(target.n_positions, len(ids), pipeline.extra_slots)
    pipeline.check_room(ids, room)
    assert len(engine.generate(ids, room).tokens) == room
    with pytest.raises(UsageError):
        pipeline.check_room(ids, room + 1)
    with pytest.raises(UsageError):
        engine.generate(ids, room + 1)


def test_compile_refuses_the_fused_engine(
    neuronx: ModuleType, tiny_model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    from neuron_ssp.backends.neuron.compile import compile_models

    config = fused_config(tiny_model_dirs, neuron={"compiled_dir": str(tmp_path / "c")})
    with pytest.raises(UsageError, match="compiles its own graph"):
        compile_models(config, plan_deployment(config), [4])


@pytest.mark.parametrize(
    ("dtype", "temperature", "refused"),
    [
        ("fp16", 1e-4, True),
        ("fp16", 0.7, False),
        ("fp32", 1e-38, True),
        ("bf16", 1e-38, True),
        ("fp32", 1e-30, False),
    ],
)
def test_a_temperature_the_device_would_turn_into_nan_is_refused(
    tiny_model_dirs: dict[str, Path], dtype: str, temperature: float, refused: bool
) -> None:
    config = fused_config(
        tiny_model_dirs,
        speculation={"acceptor": "probabilistic"},
        sampling={"temperature": temperature},
        target={"dtype": dtype},
        draft={"dtype": dtype},
    )
    mine = [p for p in validate_config(config).errors if p.field == "sampling.temperature"]
    assert bool(mine) == refused, [str(p) for p in mine]
    if refused:
        assert dtype in mine[0].rule and "NaN" in mine[0].rule and "temperature: 0" in mine[0].fix


@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
def test_the_temperature_bound_is_where_the_devices_division_overflows(dtype: str) -> None:
    """What layers/generation.py `sample` computes: logits / temperature, both in the model's dtype."""
    torch_dtype = TORCH_DTYPES[dtype]
    lowest = DEVICE_LOGIT_BOUND / DTYPE_MAX[dtype]
    logits = torch.tensor([DEVICE_LOGIT_BOUND, 0.0, -DEVICE_LOGIT_BOUND], dtype=torch_dtype)
    assert DTYPE_MAX[dtype] == torch.finfo(torch_dtype).max
    at_bound = (logits / torch.tensor(lowest * 1.01, dtype=torch_dtype)).float().softmax(-1)
    assert torch.isfinite(at_bound).all()
    below = (logits / torch.tensor(lowest / 4, dtype=torch_dtype)).float()
    assert torch.isnan(below - below.max()).any()  # inf - inf: the softmax's first step


def test_the_standin_scatters_the_token_ids_as_the_library_does(
    neuronx: ModuleType, tiny_model_dirs: dict[str, Path]
) -> None:
    """fused_speculation.py:595-605 at 1ade6d7 scatters the target's token ids into an int32 `sequences` as they
    come (no cast): on-device generation returns int32 (U32/S32 -> torch.int32, compiler.py:226), and a model
    returning anything else meets scatter_'s dtype check, as it would in the library."""
    config = fused_config(tiny_model_dirs)
    target, draft = load_neuron_backends(config, plan_deployment(config))
    engine = FusedEngine.build(config, target, draft)
    assert target.model(prompt(5).view(1, -1)).dtype == torch.int32
    forward = type(target.model).forward
    target.model.forward = lambda *args, **kwargs: forward(target.model, *args, **kwargs).to(torch.int64)
    with pytest.raises(RuntimeError, match="scatter"):
        engine.generate(prompt(7), 8)
