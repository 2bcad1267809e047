"""The row kernel on a GGUF's own blocks (platform.weights auto): the same numbers as on the de-quantised fp32 weights.

A tiny Llama is quantised with the `gguf` package (Q4_1, Q4_0, Q8_0) and written as a GGUF the way llama.cpp's
converter lays it out (q and k rows permuted); the model keeps the de-quantised values, as the embedded model does.
Every matrix product, every logit, every greedy and seeded output must then be bit for bit the fp32 kernel's, alone
and in a batch."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from conftest import TINY_VOCAB, tiny_llama
from test_batched_scoring import needs_kernel

from neuron_ssp.backends.base import Segment
from neuron_ssp.backends.torch.block_panels import block_panels, packed
from neuron_ssp.backends.torch.gguf_blocks import GgufBlocks
from neuron_ssp.backends.torch.row_kernel import row_kernel
from neuron_ssp.backends.torch.scoring import TorchBackend
from neuron_ssp.config import SamplingConfig
from neuron_ssp.drafters.ngram import NgramDrafter
from neuron_ssp.engines.base import sampling_params
from neuron_ssp.engines.continuous_batch import ContinuousBatchLoop
from neuron_ssp.engines.native import plain_generate
from neuron_ssp.engines.rows import RowSettings
from neuron_ssp.speculation.acceptors import build_acceptor
from neuron_ssp.speculation.policies import WindowPolicy

pytestmark = needs_kernel
Q = gguf.GGMLQuantizationType
LAYER_NAMES = {  # GGUF name -> the Hugging Face module path inside a layer
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def to_gguf_rows(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf permutation of q/k rows (what transformers' loader undoes)."""
    rows = weight.shape[0]
    return weight.reshape(heads, 2, rows // heads // 2, -1).swapaxes(1, 2).reshape(weight.shape)


def from_gguf_rows(weight: np.ndarray, heads: int) -> np.ndarray:
    rows = weight.shape[0]
    return weight.reshape(heads, rows // heads // 2, 2, -1).swapaxes(1, 2).reshape(weight.shape)


@torch.no_grad()
def quantised_llama(path: Path, kinds: dict[str, Q] | None = None, layers: int = 2) -> torch.nn.Module:
    """A tiny Llama whose weights are its GGUF's de-quantised values, the GGUF written at `path`. `kinds`: a GGUF
    name's type (default Q4_1 in the layers, Q8_0 for the embedding and the head)."""
    model = tiny_llama(0, layers=layers)
    config = model.config
    writer = gguf.GGUFWriter(str(path), "llama")
    parameters = dict(model.named_parameters())

    def put(name: str, parameter: torch.Tensor, kind: Q, heads: int | None = None) -> None:
        weight = parameter.detach().numpy()
        stored = to_gguf_rows(weight, heads) if heads else weight
        raw = gguf.quants.quantize(stored, kind) if kind != Q.F16 else stored.astype(np.float16)
        values = gguf.quants.dequantize(raw, kind).astype(np.float32)
        parameter.copy_(torch.from_numpy(from_gguf_rows(values, heads) if heads else values))
        writer.add_tensor(name, raw, raw_dtype=kind)

    kinds = kinds or {}
    for index in range(layers):
        for gguf_name, module in LAYER_NAMES.items():
            heads = {"attn_q": config.num_attention_heads, "attn_k": config.num_key_value_heads}.get(gguf_name)
            name = f"blk.{index}.{gguf_name}.weight"
            put(name, parameters[f"model.layers.{index}.{module}.weight"], kinds.get(name, Q.Q4_1), heads)
    put("token_embd.weight", parameters["model.embed_tokens.weight"], Q.Q8_0)
    put("output.weight", parameters["lm_head.weight"], kinds.get("output.weight", Q.Q8_0))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return model.eval()


def blocks_of(path: Path, model: torch.nn.Module) -> GgufBlocks:
    return GgufBlocks(path, model.config.num_attention_heads, model.config.num_key_value_heads)


def panels_of(path: Path, model: torch.nn.Module) -> dict:
    return packed(blocks_of(path, model), model.config.num_hidden_layers, row_kernel())


def test_the_blocks_de_quantise_to_the_models_weights_bit_for_bit(tmp_path: Path):
    # Q4_0 joins Q4_1 (as offsets -8d); Q8_0 beside Q4_1 cannot share one fused matrix; q/k rows permuted
    kinds = {"blk.0.attn_q.weight": Q.Q4_0, "blk.1.attn_v.weight": Q.Q8_0, "blk.1.ffn_down.weight": Q.Q8_0}
    model = quantised_llama(tmp_path / "tiny.gguf", kinds)
    blocks = blocks_of(tmp_path / "tiny.gguf", model)
    for index, layer in enumerate(model.model.layers):
        attn, mlp = layer.self_attn, layer.mlp
        for fused, parts in (
            ("qkv", (attn.q_proj, attn.k_proj, attn.v_proj)),
            ("o", (attn.o_proj,)),
            ("gate_up", (mlp.gate_proj, mlp.up_proj)),
            ("down", (mlp.down_proj,)),
        ):
            matrix = blocks.layer(index, fused)
            expected = torch.cat([p.weight for p in parts]).detach().numpy()
            if index == 1 and fused == "qkv":
                assert matrix is None  # one fused matrix needs one format: the fp32 path serves this one
                continue
            assert np.array_equal(matrix.dequantised(), expected), (index, fused)
    assert np.array_equal(blocks.head().dequantised(), model.lm_head.weight.detach().numpy())


@pytest.mark.parametrize("kind", [Q.Q4_1, Q.Q4_0, Q.Q8_0])
def test_every_product_of_the_block_kernel_is_the_fp32_kernels(tmp_path: Path, kind: Q):
    names = [f"blk.{i}.{n}.weight" for i in range(2) for n in LAYER_NAMES]
    model = quantised_llama(tmp_path / "tiny.gguf", dict.fromkeys(names, kind))
    blocks = blocks_of(tmp_path / "tiny.gguf", model)
    kernel = row_kernel()
    for matrix in [blocks.layer(i, f) for i in range(2) for f in ("qkv", "o", "gate_up", "down")] + [blocks.head()]:
        fp32 = kernel.pack(torch.from_numpy(matrix.dequantised()))
        packed = kernel.pack_blocks(matrix)
        assert packed.data.numel() < fp32.data.numel() * 4 // 2  # fewer bytes than half of fp32's
        for rows in (1, 2, 7, 8, 9, 64):
            x = torch.randn(rows, matrix.shape[1])
            assert torch.equal(kernel.linear(x, packed), kernel.linear(x, fp32)), (matrix.shape, rows)


def test_a_broken_packing_is_caught(tmp_path: Path):
    """The test above can fail: one nibble swapped in the packed data changes the product."""
    model = quantised_llama(tmp_path / "tiny.gguf")
    matrix = blocks_of(tmp_path / "tiny.gguf", model).layer(0, "down")
    kernel = row_kernel()
    packed = kernel.pack_blocks(matrix)
    broken = packed.data.clone()
    scale_bytes = kernel.panel_cols * 8
    broken[scale_bytes] = (broken[scale_bytes] >> 4) | (broken[scale_bytes] << 4)  # first quant byte's nibbles
    x = torch.randn(3, matrix.shape[1])
    fp32 = kernel.linear(x, kernel.pack(torch.from_numpy(matrix.dequantised())))
    assert not torch.equal(kernel.linear(x, type(packed)(broken, *matrix.shape, packed.format)), fp32)


def test_logits_alone_and_in_a_batch_are_the_fp32_weights_bit_for_bit(tmp_path: Path):
    model = quantised_llama(tmp_path / "tiny.gguf")
    on_blocks = TorchBackend(model, 128, pack=True, slots=3, blocks=panels_of(tmp_path / "tiny.gguf", model))
    on_fp32 = TorchBackend(model, 128, pack=True, slots=3)
    assert on_blocks.weights_from_blocks and not on_fp32.weights_from_blocks
    prompts = [torch.randint(1, TINY_VOCAB, (n,), generator=torch.Generator().manual_seed(n)) for n in (9, 30, 5)]
    for backend in (on_blocks, on_fp32):
        for slot, prompt in enumerate(prompts):
            backend.prefill_slot(slot, prompt)
    segments = [Segment(slot, len(p), p[:4]) for slot, p in enumerate(prompts)]
    batched = on_blocks.score_batch(segments)
    assert torch.equal(batched, on_fp32.score_batch(segments))
    alone = [on_blocks.score_batch([segment]) for segment in segments]
    assert torch.equal(batched, torch.cat(alone))  # batch invariance holds on the blocks too


@pytest.mark.parametrize("sampling", [SamplingConfig(temperature=0.0), SamplingConfig(temperature=1.0, seed=3)])
def test_speculation_on_the_blocks_gives_plain_decodings_tokens_and_the_fp32_ones(tmp_path: Path, sampling):
    model = quantised_llama(tmp_path / "tiny.gguf")
    blocks = panels_of(tmp_path / "tiny.gguf", model)
    prompt = torch.tensor([5, 7, 9, 11, 5, 7, 9, 13, 5, 7])
    params, rng = sampling_params(sampling), torch.Generator()
    settings = RowSettings(
        params,
        sampling.seed,
        lambda slot: NgramDrafter(TINY_VOCAB, 3, 1),
        build_acceptor("probabilistic", params, rng),
        WindowPolicy(4),
        rng,
    )
    speculative = ContinuousBatchLoop(TorchBackend(model, 128, pack=True, blocks=blocks), 4).run(
        settings.request(prompt, 40)
    )
    plain_blocks = plain_generate(TorchBackend(model, 128, pack=True, blocks=blocks), prompt, 40, sampling)
    plain_fp32 = plain_generate(TorchBackend(model, 128, pack=True), prompt, 40, sampling)
    assert speculative.tokens == plain_blocks.tokens == plain_fp32.tokens
    assert speculative.stats.draft_tokens > 0


def test_a_matrix_of_another_type_keeps_the_fp32_path(tmp_path: Path):
    model = quantised_llama(tmp_path / "tiny.gguf", {"blk.1.ffn_gate.weight": Q.F16, "output.weight": Q.F16})
    blocks = blocks_of(tmp_path / "tiny.gguf", model)
    assert blocks.layer(1, "gate_up") is None and blocks.head() is None
    on_blocks = TorchBackend(model, 64, pack=True, blocks=panels_of(tmp_path / "tiny.gguf", model))
    on_fp32 = TorchBackend(model, 64, pack=True)
    prompt = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6])
    assert torch.equal(on_blocks.prefill(prompt), on_fp32.prefill(prompt))


def test_the_packed_panels_are_cached_and_read_back_the_same(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("NEURON_SSP_CACHE", str(tmp_path / "cache"))
    model = quantised_llama(tmp_path / "tiny.gguf")
    config = model.config
    args = (tmp_path / "tiny.gguf", config.num_attention_heads, config.num_key_value_heads, 2, row_kernel())
    first = block_panels(*args)
    assert list((tmp_path / "cache" / "block-panels").glob("*.safetensors"))
    again = block_panels(*args)
    assert first.keys() == again.keys() == panels_of(tmp_path / "tiny.gguf", model).keys()
    for name, panels in first.items():
        assert torch.equal(panels.data, again[name].data)
        assert (panels.out_features, panels.in_features, panels.format) == (
            again[name].out_features,
            again[name].in_features,
            again[name].format,
        )
