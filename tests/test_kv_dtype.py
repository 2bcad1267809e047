"""platform.kv_dtype: the compact forward's KV cache in bfloat16. The guarantees of a float32 cache hold in the same
setting (a row in a batch equals it alone, bit for bit on the row kernel; greedy speculation equals plain greedy
decoding), the cache holds torch's rounding of what a float32 cache holds, and the logits stay near a float32
cache's."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_llama
from test_batched_scoring import PROMPTS, SLOTS, run_mixes
from test_compact_forward import rope_llama

from neuron_ssp.backends.torch import row_kernel as kernel_module
from neuron_ssp.backends.torch.load import KV_DTYPES, check_caches_fit
from neuron_ssp.backends.torch.scoring import TorchBackend, kv_cache_bytes
from neuron_ssp.config import SamplingConfig, load_config
from neuron_ssp.drafters import ModelDrafter
from neuron_ssp.engines.base import sampling_params
from neuron_ssp.engines.native import SpeculativeGenerator, plain_generate
from neuron_ssp.errors import UsageError
from neuron_ssp.speculation.acceptors import build_acceptor
from neuron_ssp.speculation.policies import FixedPolicy

BF16 = torch.bfloat16
GREEDY = SamplingConfig(temperature=0.0)
needs_kernel = pytest.mark.skipif(
    kernel_module.row_kernel() is None, reason=f"row kernel not built: {kernel_module.unavailable_reason()}"
)


@needs_kernel
@pytest.mark.parametrize("model", [tiny_llama(0), rope_llama(None)], ids=["gqa-head_dim-8", "gqa-head_dim-16"])
@pytest.mark.parametrize("batched_threads", [1, 3])
def test_with_a_bf16_cache_a_row_kernel_row_is_bit_identical_to_its_segment_alone(model, batched_threads):
    batched = TorchBackend(model, 128, pack=True, slots=SLOTS, kv_dtype=BF16)
    alone = [TorchBackend(model, 128, pack=True, kv_dtype=BF16) for _ in PROMPTS]
    assert batched._forward.values.dtype == BF16 and batched._forward.caches[0].keys.dtype == BF16
    for together, separate in run_mixes(batched, alone, batched_threads):
        assert torch.equal(together, separate)


def test_with_a_bf16_cache_the_torch_path_matches_its_segments_alone():
    model = tiny_llama(1)
    batched = TorchBackend(model, 128, pack=False, slots=SLOTS, kv_dtype=BF16)
    assert batched._forward._kernel is None and batched._forward.values.dtype == BF16
    alone = [TorchBackend(model, 128, pack=False, kv_dtype=BF16) for _ in PROMPTS]
    for together, separate in run_mixes(batched, alone):
        torch.testing.assert_close(together, separate, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("pack", [True, False])
def test_the_bf16_cache_holds_torchs_rounding_of_the_float32_caches_values(pack):
    """Layer 0's keys and values come from the embeddings alone, so both caches hold the same numbers there, one
    rounded to bfloat16 as torch rounds (to nearest, ties to even); the logits stay near the float32 cache's."""
    model, prompt = tiny_llama(2), torch.arange(1, 40) % 97
    full, half = (TorchBackend(model, 64, pack=pack, kv_dtype=dtype) for dtype in (torch.float32, BF16))
    logits = [backend.prefill(prompt) for backend in (full, half)]
    for ours, theirs in ((half._forward.keys, full._forward.keys), (half._forward.values, full._forward.values)):
        assert ours.dtype == BF16
        assert torch.equal(ours[0, 0, :, : len(prompt)], theirs[0, 0, :, : len(prompt)].to(BF16))
    torch.testing.assert_close(logits[1], logits[0], atol=0.05, rtol=0.05)
    assert not torch.equal(logits[1], logits[0])  # the cache really is bfloat16


@pytest.mark.parametrize("pack", [True, False])
def test_greedy_speculation_with_a_bf16_cache_equals_plain_greedy_decoding_with_it(pack):
    target_model, draft_model = tiny_llama(0), tiny_llama(0)
    with torch.no_grad():
        for param in draft_model.parameters():
            param.add_(torch.randn(param.shape, generator=torch.Generator().manual_seed(3)) * 0.2 * param.abs().mean())
    prompt = torch.tensor([1, 5, 7, 9, 5, 7, 11, 13])
    params, rng = sampling_params(GREEDY), torch.Generator()
    target = TorchBackend(target_model, 256, pack=pack, kv_dtype=BF16)
    drafter = ModelDrafter(TorchBackend(draft_model, 256, pack=pack, kv_dtype=BF16), params, rng)
    generator = SpeculativeGenerator(
        target, drafter, build_acceptor("greedy", params, rng), FixedPolicy(4), GREEDY, 4, rng
    )
    result = generator.generate(prompt, 40)
    plain = plain_generate(TorchBackend(target_model, 256, pack=pack, kv_dtype=BF16), prompt, 40, GREEDY)
    assert result.tokens == plain.tokens
    assert 0 < result.stats.acceptance_rate < 1  # some drafts rejected: rollbacks in the bf16 cache


@pytest.mark.parametrize("pack", [True, False])
def test_kv_cache_bytes_counts_what_a_bf16_cache_allocates(pack):
    model = rope_llama(None)
    forward = TorchBackend(model, 100, pack=pack, slots=3, kv_dtype=BF16)._forward
    keys = forward.caches[0].keys if pack else forward.keys  # a layer's view: its storage is every layer's
    allocated = keys.untyped_storage().nbytes() + forward.values.untyped_storage().nbytes()
    assert allocated <= kv_cache_bytes(model, 3, 100, BF16) <= allocated + 2 * 3 * 16 * 16 * 2
    assert kv_cache_bytes(model, 3, 100, BF16) * 2 == kv_cache_bytes(model, 3, 100)


def test_the_loader_checks_the_cache_in_the_dtype_it_will_hold(monkeypatch):
    from neuron_ssp.backends.torch import load as torch_load

    model = tiny_llama(0)
    half = kv_cache_bytes(model, 8, 64, BF16)
    monkeypatch.setattr(torch_load, "host_memory_available", lambda: half)
    check_caches_fit([(model, 64)], 8, torch.device("cpu"), "auto", BF16)
    with pytest.raises(UsageError):  # the same cache in float32 does not fit
        check_caches_fit([(model, 64)], 8, torch.device("cpu"), "auto", torch.float32)
    with pytest.raises(UsageError):  # Hugging Face's forward keeps its cache in the model's dtype
        check_caches_fit([(model, 64)], 8, torch.device("cpu"), "hf", BF16)


def test_the_setting_takes_float32_or_bfloat16_and_names_the_field_otherwise():
    assert set(KV_DTYPES) == {"float32", "bfloat16"}
    assert load_config(None, {"platform.kv_dtype": "bfloat16"}).platform.kv_dtype == "bfloat16"
    with pytest.raises(UsageError) as err:
        load_config(None, {"platform.kv_dtype": "fp8"})
    assert err.value.problems[0].field == "platform.kv_dtype"
