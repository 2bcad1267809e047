"""The row kernel (row_kernel.c, llama_layer.c): Hugging Face's numbers within fp32 tolerance, each row's
bits independent of the rows that came with it (so a wide call and one-token calls agree exactly), any
shape, any thread count; without a compiler the forward falls back to oneDNN and says why."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from conftest import tiny_llama
from test_compact_forward import rope_llama

from neuron_ssp.backends.torch import row_kernel as kernel_module
from neuron_ssp.backends.torch.llama_weights import llama_weights
from neuron_ssp.backends.torch.row_kernel import LayerCache, Spans
from neuron_ssp.backends.torch.scoring import TorchBackend

KERNEL = kernel_module.row_kernel()
needs_kernel = pytest.mark.skipif(KERNEL is None, reason=f"row kernel not built: {kernel_module.unavailable_reason()}")


@needs_kernel
@pytest.mark.parametrize(("out_features", "in_features"), [(97, 48), (130, 40), (5, 3), (960, 576)])
def test_products_match_float64_for_any_shape_and_row_count(out_features, in_features):
    torch.manual_seed(out_features)
    weight = torch.randn(out_features, in_features)
    panels = KERNEL.pack(weight)
    for rows in (1, 2, 7, 8, 9, 17, 64):
        x = torch.randn(rows, in_features)
        exact = F.linear(x.double(), weight.double())
        torch.testing.assert_close(KERNEL.linear(x, panels).double(), exact, atol=1e-5 * in_features**0.5, rtol=1e-5)


@needs_kernel
def test_a_rows_result_does_not_depend_on_the_rows_beside_it_or_the_thread_count():
    torch.manual_seed(1)
    weight, x = torch.randn(200, 64), torch.randn(16, 64)
    panels = KERNEL.pack(weight)
    together = KERNEL.linear(x, panels)
    for row in (0, 7, 8, 15):
        assert torch.equal(KERNEL.linear(x[row : row + 1], panels), together[row : row + 1])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert torch.equal(KERNEL.linear(x, panels), together)
    finally:
        torch.set_num_threads(threads)


@needs_kernel
@pytest.mark.parametrize(
    "model",
    [
        tiny_llama(0),
        rope_llama(
            {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            }
        ),
    ],
    ids=["mha-head_dim-8", "gqa-llama3-rope"],
)
@pytest.mark.parametrize("prompt_len", [12, 75])  # 75: the window's slots span several vectors of the softmax
def test_the_layer_kernel_matches_hugging_face_and_a_wide_call_equals_one_token_calls(model, prompt_len):
    prompt = torch.tensor([1, 5, 7, 9, 5, 7, 11, 13, 5, 7, 3, 2] * 7)[:prompt_len]
    ours, reference, stepwise = (
        TorchBackend(model, 512, pack=True),
        TorchBackend(model, 512, forward="hf"),
        TorchBackend(model, 512, pack=True),
    )
    assert ours._forward.w.layout == "row kernel" and ours._forward._kernel is not None
    torch.testing.assert_close(ours.prefill(prompt), reference.prefill(prompt), atol=1e-4, rtol=1e-4)
    stepwise.prefill(prompt)
    window = torch.tensor([4, 8, 15, 16, 23, 42])
    wide = ours.score(window, len(prompt))
    torch.testing.assert_close(wide, reference.score(window, len(prompt)), atol=1e-4, rtol=1e-4)
    one_by_one = torch.cat([stepwise.score(window[i : i + 1], len(prompt) + i) for i in range(len(window))])
    assert torch.equal(wide, one_by_one)


def test_without_a_compiler_the_forward_keeps_onednn_and_says_why(monkeypatch, tmp_path):
    monkeypatch.setenv("NEURON_SSP_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", "no-such-cc")
    kernel_module._built.cache_clear()
    kernel_module.row_kernel.cache_clear()
    try:
        assert kernel_module.row_kernel() is None
        assert "no C compiler (no-such-cc)" in kernel_module.unavailable_reason()
        with pytest.warns(UserWarning, match="row kernel is unavailable .*no C compiler"):
            weights = llama_weights(tiny_llama(3), pack=True)
        assert weights.layout == "oneDNN packed" and weights.layers[0].qkv.packed is not None
    finally:
        kernel_module._built.cache_clear()
        kernel_module.row_kernel.cache_clear()


@pytest.mark.skipif(KERNEL is None, reason="needs a working C compiler to fail on purpose")
def test_a_failed_build_is_a_reason_not_a_crash_and_a_good_one_is_cached(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("NEURON_SSP_CACHE", str(tmp_path))
    kernel_module._built.cache_clear()
    try:
        monkeypatch.setenv("CC", "false")
        assert "could not build row_kernel.c, llama_layer.c" in kernel_module.unavailable_reason()
        kernel_module._built.cache_clear()
        monkeypatch.delenv("CC")
        capsys.readouterr()
        assert kernel_module.unavailable_reason() is None
        assert "Building the CPU row kernel once" in capsys.readouterr().err  # a first run's ~10 s pause says why
        assert len(list((tmp_path / "kernels").glob("row_kernel-*.so"))) == 1
        assert not list((tmp_path / "kernels").glob("tmp*"))
    finally:
        kernel_module._built.cache_clear()


def _has_avx2() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False
    return "avx2" in flags and "fma" in flags


@pytest.mark.skipif(KERNEL is None or not _has_avx2(), reason="needs a C compiler and an x86 CPU with AVX2")
def test_the_avx2_build_of_machines_without_avx512_computes_the_same(monkeypatch, tmp_path):
    """Laptops and many CI machines have AVX2 only: 8-float vectors, narrower panels, fewer rows a block."""
    monkeypatch.setenv("NEURON_SSP_CACHE", str(tmp_path))
    monkeypatch.setattr(kernel_module, "FLAG_SETS", (("-O3", "-march=x86-64-v3", "-fopenmp"),))
    kernel_module._built.cache_clear()
    kernel_module.row_kernel.cache_clear()
    try:
        avx2 = kernel_module.row_kernel()
        assert avx2 is not None and avx2.panel_cols == 16
        torch.manual_seed(2)
        weight, x = torch.randn(97, 40), torch.randn(13, 40)
        together = avx2.linear(x, avx2.pack(weight))
        torch.testing.assert_close(together.double(), F.linear(x.double(), weight.double()), atol=1e-5, rtol=1e-5)
        assert torch.equal(avx2.linear(x[6:7], avx2.pack(weight)), together[6:7])
        test_the_layer_kernel_matches_hugging_face_and_a_wide_call_equals_one_token_calls(tiny_llama(4), 75)
    finally:
        kernel_module._built.cache_clear()
        kernel_module.row_kernel.cache_clear()


@needs_kernel
def test_positions_and_slots_past_the_cache_are_refused_before_the_c_code_could_write_there():
    backend = TorchBackend(tiny_llama(0), 16, pack=True, slots=2)
    backend.prefill(torch.tensor([1, 2, 3]))
    backend.score(torch.tensor([4, 5]), 14)  # positions 14, 15: the last two
    with pytest.raises(IndexError, match="cache positions 15..16 are outside the cache's 16"):
        backend.score(torch.tensor([4, 5]), 15)
    with pytest.raises(ValueError, match="takes 64 inputs"):
        KERNEL.linear(torch.zeros(2, 32), KERNEL.pack(torch.zeros(8, 64)))
    with pytest.raises(ValueError, match="at most 64 rows"):  # C's buffers hold 64
        KERNEL.linear(torch.zeros(65, 64), KERNEL.pack(torch.zeros(8, 64)))
    forward = backend._forward
    layer, cache, model = forward.w.layers[0], forward.caches[0], forward._kernel
    rotary = (forward.cos.squeeze(1).contiguous(), forward.sin.squeeze(1).contiguous())
    with pytest.raises(ValueError, match="dense"):  # keys stored the usual way, not in tiles of positions
        KERNEL.model(
            [(layer.panels(), (layer.attn_norm, layer.mlp_norm), LayerCache(cache.standard_keys(), cache.values))],
            rotary,
            model.shape,
        )
    one_row = torch.zeros(1, model.shape.hidden)
    with pytest.raises(IndexError, match="cache slot 2 is outside the cache's 2"):
        model.call(one_row, Spans.of([(2, 0, 1)]))
    with pytest.raises(ValueError, match="1 rows for segments of 2"):
        model.call(one_row, Spans.of([(0, 0, 1), (1, 0, 1)]))
    layers = len(forward.w.layers)
    with pytest.raises(IndexError, match=f"layers 0..{layers} of {layers}"):
        model.call(one_row, Spans.of([(0, 0, 1)])).run(0, layers + 1)
