"""A GGUF's quantised matrices as they are stored, for the row kernel's block panels (row_kernel.c block_linear).

The embedded model's fp32 weights ARE its GGUF's Q4_1 (layers) and Q8_0 (token embedding, the tied head) values
de-quantised, so reading the blocks instead computes the same numbers from ~0.75 bytes a weight instead of 4. Read
with the `gguf` package (its reader and quantisation constants); q and k rows are put in Hugging Face's order
the way transformers' GGUF loader does it (`_reverse_permute_weights`, modeling_gguf_pytorch_utils.py: the
reshape (heads, dim, 2) and swap of llama.cpp's convert_hf_to_gguf.py permutation, undone), so the row kernel's
outputs come out in the order the fp32 model's do. Q4_0 is taken as Q4_1 with offset -8d (exact in fp32).
Other types (F16, the K-quants, ...) are not read: those matrices keep the fp32 path.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from neuron_ssp.embedded.gguf_convert import gguf_reader

GROUP = 32  # weights per block of Q4_0, Q4_1 and Q8_0 (ggml's QK4_0, QK4_1, QK8_0), one kernel group
FORMAT_Q4, FORMAT_Q8 = 1, 2  # row_kernel.c's formats (0: fp32 panels)
GGUF_NAMES = {  # our fused matrix -> the GGUF tensors it joins, in order (blk.{i}.<name>.weight)
    "qkv": ("attn_q", "attn_k", "attn_v"),
    "o": ("attn_output",),
    "gate_up": ("ffn_gate", "ffn_up"),
    "down": ("ffn_down",),
}


@dataclass(frozen=True)
class BlockMatrix:
    """An (out, in) matrix as groups of GROUP inputs: quants (out, in) uint8 (Q4: 0..15) or int8 (Q8), scales d
    and (Q4) offsets m (out, in / GROUP) fp32; w = q * d + m."""

    format: int
    quants: np.ndarray
    scales: np.ndarray
    offsets: np.ndarray | None

    @property
    def shape(self) -> tuple[int, int]:
        return int(self.quants.shape[0]), int(self.quants.shape[1])

    def rows(self, order: np.ndarray) -> BlockMatrix:
        offsets = None if self.offsets is None else self.offsets[order]
        return BlockMatrix(self.format, self.quants[order], self.scales[order], offsets)

    def dequantised(self) -> np.ndarray:
        """The fp32 values (GGUF's own de-quantisation: d * q, then + m): what the fp32 model holds."""
        scales = np.repeat(self.scales, GROUP, axis=1)
        values = scales * self.quants.astype(np.float32)
        return values if self.offsets is None else values + np.repeat(self.offsets, GROUP, axis=1)


def joined(parts: list[BlockMatrix]) -> BlockMatrix | None:
    """Matrices of one input width stacked by rows (q/k/v, gate/up); None when their formats differ."""
    if len({part.format for part in parts}) != 1:
        return None
    offsets = [part.offsets for part in parts]
    return BlockMatrix(
        parts[0].format,
        np.concatenate([part.quants for part in parts]),
        np.concatenate([part.scales for part in parts]),
        None if any(o is None for o in offsets) else np.concatenate(offsets),  # type: ignore[arg-type]
    )


class GgufBlocks:
    """The block matrices of one GGUF file, read when asked (the file is memory-mapped by the reader)."""

    def __init__(self, path: Path, heads: int, kv_heads: int):
        self.path = path
        self.heads, self.kv_heads = heads, kv_heads
        self._tensors = {tensor.name: tensor for tensor in gguf_reader(str(path)).tensors}

    def layer(self, index: int, fused: str) -> BlockMatrix | None:
        """Layer `index`'s q/k/v, o, gate/up or down as one block matrix; None where a part is not a block type."""
        parts = []
        for name in GGUF_NAMES[fused]:
            matrix = self._matrix(f"blk.{index}.{name}.weight")
            if matrix is None:
                return None
            if name == "attn_q":
                matrix = matrix.rows(_hf_row_order(matrix.shape[0], self.heads))
            elif name == "attn_k":
                matrix = matrix.rows(_hf_row_order(matrix.shape[0], self.kv_heads))
            parts.append(matrix)
        return joined(parts)

    def head(self) -> BlockMatrix | None:
        """The LM head: output.weight, or the token embedding it is tied to where the GGUF has none."""
        return self._matrix("output.weight" if "output.weight" in self._tensors else "token_embd.weight")

    def _matrix(self, name: str) -> BlockMatrix | None:
        tensor = self._tensors.get(name)
        if tensor is None:
            return None
        kind = tensor.tensor_type.name
        raw = np.asarray(tensor.data)
        out_features, in_features = int(tensor.shape[1]), int(tensor.shape[0])  # GGUF lists the inner dimension first
        if kind not in ("Q4_0", "Q4_1", "Q8_0") or in_features % GROUP:
            return None
        blocks = raw.reshape(out_features, in_features // GROUP, -1)
        scales = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
        if kind == "Q8_0":
            quants = blocks[..., 2:].copy().view(np.int8).reshape(out_features, in_features)
            return BlockMatrix(FORMAT_Q8, quants, scales, None)
        start = 4 if kind == "Q4_1" else 2
        packed = blocks[..., start:]  # 16 bytes: element j's nibble low, element j + 16's high
        quants = np.concatenate([packed & 0x0F, packed >> 4], axis=-1).reshape(out_features, in_features)
        if kind == "Q4_1":
            offsets = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
        else:  # Q4_0: d * (q - 8) = q * d + (-8 d), every term exact in fp32
            offsets = scales * np.float32(-8)
        return BlockMatrix(FORMAT_Q4, quants.astype(np.uint8), scales, offsets)


def _hf_row_order(rows: int, heads: int) -> np.ndarray:
    """Row i of the Hugging Face matrix is row order[i] of the GGUF's: transformers' `_reverse_permute_weights`,
    (heads, dim, 2) -> swap the last two -> flat."""
    dim = rows // heads // 2
    return np.arange(rows).reshape(heads, dim, 2).swapaxes(2, 1).reshape(rows)
