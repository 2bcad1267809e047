"""The compact Llama forward: Hugging Face's logits within fp32 tolerance, whatever
the width, the start slot and the rollbacks before it; packed and as-stored weights alike; the models it
does not cover go to Hugging Face's forward (auto) or are refused with the reason (compact)."""

from __future__ import annotations

import os
import shutil

import pytest
import torch
from conftest import tiny_llama
from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

from neuron_ssp.backends.torch.llama_weights import can_pack, llama_weights
from neuron_ssp.backends.torch.scoring import TorchBackend
from neuron_ssp.config import SamplingConfig, config_from_dict
from neuron_ssp.engines.native import plain_generate
from neuron_ssp.errors import UsageError

PROMPT = torch.tensor([1, 5, 7, 9, 5, 7, 11, 13, 5, 7, 3, 2])
TOLERANCE = {"atol": 1e-4, "rtol": 1e-4}


def rope_llama(rope_scaling: dict | None) -> LlamaForCausalLM:
    """A tiny Llama with GQA, a head_dim that is not hidden/heads, and the given rope scaling."""
    torch.manual_seed(5)
    config = LlamaConfig(
        vocab_size=97,
        hidden_size=48,
        intermediate_size=80,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=512,
        rope_scaling=rope_scaling,
    )
    return LlamaForCausalLM(config).eval()


def steps(seed: int) -> list[tuple[list[int], int]]:
    """A decoding-like schedule: widths 1..8, each call starting at or before the previous call's end
    (a rollback of the rejected tail), as the speculative loop sends them."""
    gen = torch.Generator().manual_seed(seed)
    start, calls = len(PROMPT), []
    for _ in range(12):
        width = int(torch.randint(1, 9, (1,), generator=gen))
        calls.append((torch.randint(0, 97, (width,), generator=gen).tolist(), start))
        start += int(torch.randint(1, width + 1, (1,), generator=gen))
    return calls


def assert_same_logits(model: LlamaForCausalLM, pack: bool) -> None:
    ours, reference = TorchBackend(model, 512, pack=pack), TorchBackend(model, 512, forward="hf")
    assert ours._forward.w.packed == pack
    assert ours.forward_name == "compact" and reference.forward_name == "hf"
    torch.testing.assert_close(ours.prefill(PROMPT), reference.prefill(PROMPT), **TOLERANCE)
    for tokens, start in steps(1):
        ids = torch.tensor(tokens)
        torch.testing.assert_close(ours.score(ids, start), reference.score(ids, start), **TOLERANCE)


@pytest.mark.parametrize("pack", [False, True])
def test_logits_match_hugging_face_at_every_width_and_after_rollbacks(pack):
    if pack and not torch.backends.mkldnn.is_available():
        pytest.skip("this torch has no oneDNN")
    assert_same_logits(tiny_llama(0), pack)


@pytest.mark.parametrize(
    "rope_scaling",
    [
        None,
        {"rope_type": "linear", "factor": 2.0},
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    ],
)
def test_rope_scaling_gqa_and_head_dim_follow_the_model(rope_scaling):
    assert_same_logits(rope_llama(rope_scaling), pack=False)


def test_greedy_decoding_equals_hugging_face_generate():
    model = tiny_llama(0)
    ours = plain_generate(TorchBackend(model, 512), PROMPT, 30, SamplingConfig(temperature=0.0)).tokens
    hf = model.generate(PROMPT.view(1, -1), max_new_tokens=30, min_new_tokens=30, do_sample=False, pad_token_id=0)[
        0, len(PROMPT) :
    ].tolist()
    assert ours == hf


def test_a_cpu_fp32_model_is_packed_and_draft_equal_to_target_shares_the_packing():
    model = tiny_llama(0)
    target, draft = TorchBackend(model, 512, "target"), TorchBackend(model, 512, "draft")
    assert target._forward.w is draft._forward.w  # one packed copy for both
    assert target._forward.keys is not draft._forward.keys  # never one cache
    assert target._forward.w.packed == can_pack(model) == torch.backends.mkldnn.is_available()
    assert not llama_weights(model.to(torch.bfloat16), can_pack(model)).packed or not can_pack(model)


def test_models_the_compact_forward_does_not_cover_use_hugging_face_or_are_refused():
    torch.manual_seed(0)
    mistral = MistralForCausalLM(
        MistralConfig(
            vocab_size=97,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=2,
            sliding_window=6,
        )
    ).eval()
    biased = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=97,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=4,
            attention_bias=True,
        )
    ).eval()
    for model, reason in ((mistral, "model_type is 'mistral'"), (biased, "biases")):
        assert TorchBackend(model, 512).forward_name == "hf"
        with pytest.raises(UsageError) as err:
            TorchBackend(model, 512, "target", forward="compact")
        problem = err.value.problems[0]
        assert problem.field == "platform.forward" and reason in problem.rule and "forward: hf" in problem.fix


def test_compile_with_hugging_face_forward_is_refused_in_the_config():
    with pytest.raises(UsageError) as err:
        config_from_dict({"platform": {"forward": "hf", "compile": True}})
    problem = err.value.problems[0]
    assert problem.field == "platform" and "compact forward" in problem.rule and "compile: false" in problem.fix


def test_compile_without_a_cxx_compiler_is_refused_with_the_fix(monkeypatch):
    monkeypatch.setenv("CXX", "no-such-compiler-here")
    with pytest.raises(UsageError) as err:
        TorchBackend(tiny_llama(0), 64, compile=True)
    problem = err.value.problems[0]
    assert problem.field == "platform.compile" and "no-such-compiler-here" in problem.rule
    assert "g++" in problem.fix


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which(os.environ.get("CXX", "g++")) is None,
    reason="torch.compile on a CPU (inductor) needs a C++ compiler: none on PATH",
)
def test_compiled_forward_matches_hugging_face(tmp_path, monkeypatch):
    """torch.compile (inductor, dynamic widths and slots) of the same forward gives the same logits: run here
    on the CPU, with the same code as on CUDA (where it is slower than eager: docs/configuration.md)."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    model = tiny_llama(0)
    ours, reference = TorchBackend(model, 512, compile=True), TorchBackend(model, 512, forward="hf")
    torch.testing.assert_close(ours.prefill(PROMPT), reference.prefill(PROMPT), **TOLERANCE)
    for tokens, start in steps(2)[:6]:
        ids = torch.tensor(tokens)
        torch.testing.assert_close(ours.score(ids, start), reference.score(ids, start), **TOLERANCE)
