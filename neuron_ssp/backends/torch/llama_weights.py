"""A plain Llama's weights, laid out for scoring a few tokens per call.

On a CPU in fp32 each layer's q/k/v and gate/up matrices are fused and every matrix (the LM head
included) is repacked for a kernel that reads the weights once for all rows of a call. Why: MKL's
sgemm runs one row as a matrix-vector product that streams the weights once, but 4-16 rows through a
general GEMM that costs 1.6-2.3x as much on this model. The layout is our row kernel's panels
(row_kernel.py: 1 to 64 rows; beyond, F.linear on the weights as stored) where a C compiler built it,
else oneDNN's packed layout (`torch.ops.mkldnn._reorder_linear_weight`, the one inductor's freezing
pass gives fp32 linears), used from three rows on: at one or two rows MKL on the weights as stored is
~10-20 % faster than it (benchmarks/gemm_rows.py prints the cost per row count of each layout). Either
copy costs the model's weight bytes once more. Everywhere else (CUDA, bf16/fp16, torch.compile, which
cannot trace either) only the weights as stored are used.

One layout per (model, packing) is kept while the model lives, so draft = target shares it.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F  # noqa: N812  (torch's own spelling)
from transformers import PreTrainedModel

from neuron_ssp.backends.torch.row_kernel import MAX_ROWS, Panels, row_kernel, unavailable_reason

# rope types whose frequencies depend on the sequence length: one table for all positions would be wrong
LENGTH_DEPENDENT_ROPE = ("dynamic", "longrope")
PACK_ROWS_HINT = 8  # the row count oneDNN tunes the packed layout for; measured flat from 1 to 16 rows
STORED_ROWS = 2  # up to this many rows F.linear on the weights as stored beats oneDNN's packed kernel (gemm_rows.py)

# per model: (pack, from its GGUF's blocks) -> its layout
_LAYOUTS: weakref.WeakKeyDictionary[PreTrainedModel, dict[tuple[bool, bool], LlamaWeights]] = (
    weakref.WeakKeyDictionary()
)


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

    `weights` are the model's own tensors (no copy); with `pack`, also their fused copy for the row kernel
    (every call of up to MAX_ROWS rows), or where it is unavailable for oneDNN (more than STORED_ROWS rows)."""

    def __init__(self, weights: list[torch.Tensor], pack: bool, blocks: Panels | None = None):
        """`blocks`: the same matrices fused, as their GGUF's quantised blocks packed for the row kernel
        (block_panels.py): it reads those instead of an fp32 copy (the same numbers)."""
        self.sizes = [int(w.shape[0]) for w in weights]
        self.weights = weights
        self.kernel = row_kernel() if pack else None
        fused = torch.cat(weights).contiguous() if pack and (blocks is None or self.kernel is None) else None
        self.panels: Panels | None = None
        if self.kernel is not None:
            self.panels = blocks if blocks is not None else self.kernel.pack(fused)
        self.packed = (
            torch.ops.mkldnn._reorder_linear_weight(fused, PACK_ROWS_HINT) if pack and self.kernel is None else None
        )

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        rows = x.shape[0]
        if self.panels is not None and rows <= MAX_ROWS:
            out = self.kernel.linear(x, self.panels)
        elif self.packed is not None and rows > STORED_ROWS:
            out = torch.ops.mkldnn._linear_pointwise(x, self.packed, None, "none", [], "")
        else:
            return [F.linear(x, w) for w in self.weights]
        return list(out.split(self.sizes, dim=-1)) if len(self.sizes) > 1 else [out]


@dataclass(frozen=True)
class LlamaLayer:
    attn_norm: torch.Tensor
    qkv: Linears
    o: Linears
    mlp_norm: torch.Tensor
    gate_up: Linears
    down: Linears

    def panels(self) -> tuple[Panels, Panels, Panels, Panels]:
        """The row kernel's copies of q/k/v, o, gate/up and down (the layout must be "row kernel")."""
        matrices = (self.qkv.panels, self.o.panels, self.gate_up.panels, self.down.panels)
        if any(panels is None for panels in matrices):
            raise RuntimeError("this layer's weights are not laid out for the row kernel")
        return matrices  # type: ignore[return-value]  (checked just above)


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
    layout: str  # what the few-row calls run on: "row kernel", "oneDNN packed" or "as stored"
    from_blocks: bool = False  # the row kernel reads the GGUF's quantised blocks (platform.weights auto)

    @property
    def packed(self) -> bool:
        return self.layout != "as stored"

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


def llama_weights(model: PreTrainedModel, pack: bool, blocks: Mapping[str, Panels] | None = None) -> LlamaWeights:
    """The model's weights in the layout `pack` asks for, its matrices from `blocks` (its GGUF's own quantised
    blocks, block_panels.py: "<layer>.<qkv|o|gate_up|down>" and "head") where given and the row kernel is built;
    built once per model and layout."""
    per_model = _LAYOUTS.setdefault(model, {})
    key = (pack, blocks is not None and pack and row_kernel() is not None)
    if key not in per_model:
        per_model[key] = _build(model, pack, blocks if key[1] else None)
    return per_model[key]


@torch.no_grad()
def _build(model: PreTrainedModel, pack: bool, blocks: Mapping[str, Panels] | None = None) -> LlamaWeights:
    config = model.config
    heads = int(config.num_attention_heads)
    if pack and row_kernel() is None:
        warnings.warn(
            f"the row kernel is unavailable ({unavailable_reason()}); wide calls use oneDNN's packed "
            "kernel, ~1.3x slower at width 8 (docs/benchmarks.md)",
            stacklevel=3,
        )
    layers = []
    for index, layer in enumerate(model.model.layers):
        attn, mlp = layer.self_attn, layer.mlp

        def fused(name: str, index: int = index) -> Panels | None:
            return blocks.get(f"{index}.{name}") if blocks is not None else None

        layers.append(
            LlamaLayer(
                attn_norm=layer.input_layernorm.weight,
                qkv=Linears([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight], pack, fused("qkv")),
                o=Linears([attn.o_proj.weight], pack, fused("o")),
                mlp_norm=layer.post_attention_layernorm.weight,
                gate_up=Linears([mlp.gate_proj.weight, mlp.up_proj.weight], pack, fused("gate_up")),
                down=Linears([mlp.down_proj.weight], pack, fused("down")),
            )
        )
    return LlamaWeights(
        layers=layers,
        embed=model.model.embed_tokens.weight,
        norm=model.model.norm.weight,
        head=Linears([model.get_output_embeddings().weight], pack, blocks.get("head") if blocks is not None else None),
        heads=heads,
        kv_heads=int(getattr(config, "num_key_value_heads", None) or heads),
        head_dim=int(getattr(config, "head_dim", None) or config.hidden_size // heads),
        eps=float(config.rms_norm_eps),
        layout=_layout_name(pack),
        from_blocks=bool(blocks),
    )


def _layout_name(pack: bool) -> str:
    if not pack:
        return "as stored"
    return "row kernel" if row_kernel() is not None else "oneDNN packed"
