"""A plain Llama's weights, laid out for scoring a few tokens per call.

On a CPU in fp32 each layer's q/k/v and gate/up matrices are fused and every matrix (the LM head
included) is also packed for oneDNN with `torch.ops.mkldnn._reorder_linear_weight`, the layout
inductor's freezing pass gives fp32 linears (torch/_inductor/fx_passes/mkldnn_fusion.py). Why: MKL's
sgemm runs one row as a matrix-vector product that streams the weights once, but 4-16 rows through a
general GEMM that costs 1.6-2.3x as much on this model; oneDNN's packed kernel reads the weights once
for all rows. One or two rows still go through `F.linear` on the weights as stored: MKL's kernels
there are ~10-20 % faster than the packed one; from three rows on the packed one wins
(benchmarks/gemm_rows.py and scoring_speed.py print the cost per row count of each layout). The
packed copy costs the model's weight bytes once more. Everywhere else (CUDA, bf16/fp16,
torch.compile, which cannot trace oneDNN tensors) only the weights as stored are used.

One layout per (model, packing) is kept while the model lives, so draft = target shares it.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F  # noqa: N812  (torch's own spelling)
from transformers import PreTrainedModel

# rope types whose frequencies depend on the sequence length: one table for all positions would be wrong
LENGTH_DEPENDENT_ROPE = ("dynamic", "longrope")
PACK_ROWS_HINT = 8  # the row count oneDNN tunes the packed layout for; measured flat from 1 to 16 rows
STORED_ROWS = 2  # up to this many rows F.linear on the weights as stored beats the packed kernel (gemm_rows.py)

_LAYOUTS: weakref.WeakKeyDictionary[PreTrainedModel, dict[bool, LlamaWeights]] = weakref.WeakKeyDictionary()


def unsupported_reason(model: PreTrainedModel) -> str | None:
    """Why the compact forward cannot run this model (None: it can): it covers a plain Llama only."""
    config = model.config
    inner = getattr(model, "model", None)
    rotary = getattr(inner, "rotary_emb", None)
    if config.model_type != "llama":
        return f"model_type is {config.model_type!r}, not 'llama'"
    if getattr(config, "attention_bias", False) or getattr(config, "mlp_bias", False):
        return "its projections have biases"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"hidden_act is {config.hidden_act!r}, not 'silu'"
    if rotary is None or not hasattr(inner, "layers"):
        return "this transformers' Llama has no model.rotary_emb (4.45 or newer has)"
    if getattr(rotary, "rope_type", "default") in LENGTH_DEPENDENT_ROPE:
        return f"rope type {rotary.rope_type!r} changes with the sequence length"
    return None


class Linears:
    """One or more (out, in) matrices applied to the same input; returns one output per matrix.

    `weights` are the model's own tensors (no copy); `packed`, when asked for, their fused oneDNN copy,
    used for every call of more than STORED_ROWS rows."""

    def __init__(self, weights: list[torch.Tensor], pack: bool):
        self.sizes = [int(w.shape[0]) for w in weights]
        self.weights = weights
        self.packed = torch.ops.mkldnn._reorder_linear_weight(torch.cat(weights).contiguous(), PACK_ROWS_HINT) \
            if pack else None

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        if self.packed is None or x.shape[0] <= STORED_ROWS:
            return [F.linear(x, w) for w in self.weights]
        out = torch.ops.mkldnn._linear_pointwise(x, self.packed, None, "none", [], "")
        return list(out.split(self.sizes, dim=-1)) if len(self.sizes) > 1 else [out]


@dataclass(frozen=True)
class LlamaLayer:
    attn_norm: torch.Tensor
    qkv: Linears
    o: Linears
    mlp_norm: torch.Tensor
    gate_up: Linears
    down: Linears


@dataclass(frozen=True)
class LlamaWeights:
    layers: list[LlamaLayer]
    embed: torch.Tensor  # (vocab, hidden), as stored
    norm: torch.Tensor
    head: Linears
    heads: int
    kv_heads: int
    head_dim: int
    eps: float
    packed: bool

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.dtype

    @property
    def device(self) -> torch.device:
        return self.embed.device


def can_pack(model: PreTrainedModel) -> bool:
    """oneDNN packing pays on a CPU in fp32 (measured); it needs torch built with oneDNN."""
    weight = model.get_output_embeddings().weight
    return weight.device.type == "cpu" and weight.dtype == torch.float32 and torch.backends.mkldnn.is_available()


def llama_weights(model: PreTrainedModel, pack: bool) -> LlamaWeights:
    """The model's weights in the layout `pack` asks for; built once per model and layout."""
    per_model = _LAYOUTS.setdefault(model, {})
    if pack not in per_model:
        per_model[pack] = _build(model, pack)
    return per_model[pack]


@torch.no_grad()
def _build(model: PreTrainedModel, pack: bool) -> LlamaWeights:
    config = model.config
    heads = int(config.num_attention_heads)
    layers = []
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        layers.append(LlamaLayer(
            attn_norm=layer.input_layernorm.weight,
            qkv=Linears([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight], pack),
            o=Linears([attn.o_proj.weight], pack),
            mlp_norm=layer.post_attention_layernorm.weight,
            gate_up=Linears([mlp.gate_proj.weight, mlp.up_proj.weight], pack),
            down=Linears([mlp.down_proj.weight], pack)))
    return LlamaWeights(
        layers=layers, embed=model.model.embed_tokens.weight, norm=model.model.norm.weight,
        head=Linears([model.get_output_embeddings().weight], pack), heads=heads,
        kv_heads=int(getattr(config, "num_key_value_heads", None) or heads),
        head_dim=int(getattr(config, "head_dim", None) or config.hidden_size // heads),
        eps=float(config.rms_norm_eps), packed=pack)
