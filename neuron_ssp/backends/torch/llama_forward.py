"""Our own forward of a plain Llama over Hugging Face's weights, with a preallocated KV cache of `slots` sequences.

The cache is addressed by (slot, position), as on Neuron (`cache_ids`): a call writes the keys and values of
positions start..start+n-1 of a slot and attends to its positions 0..start+n-1, so rolling back a rejected draft
costs nothing (later positions are ignored, then overwritten). One call scores several sequences (segments, each
on its own slot, never seeing another). No per-call cache object, no mask over the whole cache, no per-layer
module dispatch: the same arithmetic as Hugging Face's LlamaForCausalLM, in the order it does it (tests check
the logits against its forward within fp32 tolerance).

Rotary tables are computed once per backend by the model's own `rotary_emb` (every rope type whose
frequencies do not change with the length: default, linear, llama3, yarn), for its n_positions.

With the row kernel built (llama_weights.py, row_kernel.py), a call runs its decoder layers in C (llama_layer.c)
over at most MAX_ROWS rows of all its segments together (each weight read once for all of them); a wider call, a
long prompt's prefill included, is cut into such chunks. Its rows do not depend on each other, so a row's logits
are bit-identical whichever rows, segments and chunks share its call, and a prompt prefilled whole leaves the
cache a chunked prefill leaves. The torch path (no kernel: no C compiler, CUDA, bf16/fp16,
NEURON_SSP_ROW_KERNEL=0) runs the linear layers over all rows together and attention segment by segment; its
GEMMs may round differently for different row counts, so there a row's logits can differ in the last bits with
the rows beside it.

The cache holds `kv_dtype` (float32, or bfloat16: half the bytes attention reads per step; platform.kv_dtype);
attention computes in fp32 from the stored values, the new rows' keys and values included.

`compile=True` runs the forward through `torch.compile` (inductor, dynamic shapes: widths and
positions vary; no CUDA graphs). It is not a fast path. On an NVIDIA H100 (measured once by a project
session: torch 2.11.0+cu130, transformers 5.17.0, the embedded model in fp32, synchronised medians) a
one-token call took 39.4 ms compiled against 11.8 ms eager, and a width-8 call 29.0 against 14.7 ms. Every
call there is bound by Python and kernel launches (the memory-bound limit is ~0.2 ms a call). The fast
path on a GPU, fixed shapes captured once and replayed as CUDA graphs, is future work with batching. On a
CPU the compiled forward runs torch's ops, not the row kernel, and never beat the row kernel. Compiling
takes minutes there. Inductor keeps its compiled artifacts in `TORCHINDUCTOR_CACHE_DIR`, which
`_compiled` sets to the package cache only where it is unset. With transformers 5.x (torch 2.13) it is
already set when `_compiled` runs: importing transformers imports torch._dynamo, whose package.py calls
inductor's `cache_dir()` at import, and that sets the variable to the default, /tmp/torchinductor_<user>.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F  # noqa: N812  (torch's own spelling)

from neuron_ssp.backends.base import KvBlock, Scored, Segment
from neuron_ssp.backends.torch.llama_weights import LlamaWeights
from neuron_ssp.backends.torch.row_kernel import (
    KEY_TILE,
    MAX_ROWS,
    KernelModel,
    LayerCache,
    LayerShape,
    Spans,
    allocate_caches,
    row_kernel,
)
from neuron_ssp.embedded.cache import cache_root

Span = tuple[int, int, int]  # one segment of a call: (cache slot, first position, rows)


class CompactLlama:
    """`slots` sequences: their KV cache, keys and values of (slots, kv_heads, n_positions, head_dim) per layer, in
    `kv_dtype`. With the row kernel it is laid out as llama_layer.c reads it (row_kernel.LayerCache: keys in tiles of
    positions); `keys` gives them in the usual shape either way. A base.PrefixBlocks of one key tile a block."""

    block_positions = KEY_TILE

    def __init__(
        self,
        weights: LlamaWeights,
        rotary: torch.nn.Module,
        n_positions: int,
        compile: bool = False,
        slots: int = 1,
        kv_dtype: torch.dtype = torch.float32,
    ):
        self.w = weights
        self.kv_dtype = kv_dtype
        kernel = row_kernel() if weights.layout == "row kernel" else None
        self.cos, self.sin = _rotary_tables(rotary, weights, n_positions)
        self._run: Callable[..., Scored] = _compiled(self._forward) if compile else self._forward
        self.taps: tuple[int, ...] = ()  # layers whose input residual stream a call returns where asked (set_taps)
        self._kernel: KernelModel | None = None
        if kernel is not None:
            keys, self.values = allocate_caches(
                len(weights.layers), slots, weights.kv_heads, n_positions, weights.head_dim, kv_dtype
            )
            self._tiled_keys = keys  # (layers, slots, kv_heads, tiles, head_dim, KEY_TILE): every layer's tiles
            self.caches = [LayerCache(k, v) for k, v in zip(keys.unbind(0), self.values.unbind(0), strict=True)]
            shape = LayerShape(
                hidden=int(weights.embed.shape[1]),
                heads=weights.heads,
                kv_heads=weights.kv_heads,
                head_dim=weights.head_dim,
                inter=weights.layers[0].gate_up.sizes[0],
                eps=weights.eps,
            )
            rotary_rows = (self.cos.squeeze(1).contiguous(), self.sin.squeeze(1).contiguous())
            layers = [
                (layer.panels(), (layer.attn_norm, layer.mlp_norm), cache)
                for layer, cache in zip(weights.layers, self.caches, strict=True)
            ]
            self._kernel = kernel.model(layers, rotary_rows, shape)
        else:
            dims = (len(weights.layers), slots, weights.kv_heads, n_positions, weights.head_dim)
            self._keys = torch.zeros(dims, dtype=kv_dtype, device=weights.device)
            self.values = torch.zeros(dims, dtype=kv_dtype, device=weights.device)
            self._layers = list(zip(weights.layers, self._keys.unbind(0), self.values.unbind(0), strict=True))

    @property
    def on_row_kernel(self) -> bool:
        return self._kernel is not None

    @property
    def keys(self) -> torch.Tensor:
        """The keys, (layers, slots, kv_heads, n_positions, head_dim): the cache itself on the torch path, a copy of
        the row kernel's tiles."""
        if self._kernel is None:
            return self._keys
        return torch.stack([cache.standard_keys() for cache in self.caches])

    def read_block(self, slot: int, index: int) -> KvBlock:
        """A copy of the keys and values of positions index*KEY_TILE.. (one key tile) of `slot`, every layer: a
        block of the prefix pool (engines/prefix_pool.py)."""
        positions = slice(index * KEY_TILE, (index + 1) * KEY_TILE)
        keys = self._tiled_keys[:, slot, :, index] if self._kernel is not None else self._keys[:, slot, :, positions]
        values = self.values[:, slot, :, positions]
        return KvBlock(keys.to("cpu", copy=True), values.to("cpu", copy=True))  # host memory, wherever the cache is

    def write_block(self, slot: int, index: int, block: KvBlock) -> None:
        """`read_block`'s copy back into positions index*KEY_TILE.. of `slot` (any slot: the bytes are the same)."""
        positions = slice(index * KEY_TILE, (index + 1) * KEY_TILE)
        keys = self._tiled_keys[:, slot, :, index] if self._kernel is not None else self._keys[:, slot, :, positions]
        keys.copy_(block.keys)
        self.values[:, slot, :, positions].copy_(block.values)

    def prefill(self, slot: int, prompt_ids: torch.Tensor, hidden: bool = False) -> Scored:
        """The prompt into positions 0.. of `slot`: the last row's logits, and with `hidden` every row's taps."""
        rows = int(prompt_ids.shape[0])
        logits, taps = self.score([Segment(slot, 0, prompt_ids, logits_rows=1, hidden_rows=rows if hidden else 0)])
        return logits[-1], taps

    def score(self, segments: Sequence[Segment]) -> Scored:
        """Every segment's rows, in order (and the taps of each one's last `hidden_rows`); with the row kernel in
        chunks of at most MAX_ROWS rows."""
        ids = torch.cat([segment.tokens for segment in segments]).to(self.w.device)
        spans = [(segment.slot, segment.start, int(segment.tokens.shape[0])) for segment in segments]
        kept = _kept_rows(segments, self.w.device)
        tapped = _tapped_rows(segments, self.w.device)
        if self._kernel is None:
            return self._run(ids, tuple(spans), kept, tapped)
        parts, begin = [], 0
        for chunk in row_chunks(spans, MAX_ROWS):
            end = begin + sum(count for _, _, count in chunk)
            parts.append(self._run(ids[begin:end], chunk, _in_chunk(kept, begin, end), _in_chunk(tapped, begin, end)))
            begin = end
        if len(parts) == 1:
            return parts[0]
        taps = [part_taps for _, part_taps in parts if part_taps is not None]
        return torch.cat([logits for logits, _ in parts]), torch.cat(taps) if taps else None

    def _forward(
        self, ids: torch.Tensor, spans: tuple[Span, ...], kept: torch.Tensor | None, tapped: torch.Tensor | None = None
    ) -> Scored:
        """The logits of the rows `kept` (None: all): the head is skipped for prompt rows nobody reads. With
        `tapped` (row indices), those rows' residual streams entering each of `taps`' layers, side by side."""
        w = self.w
        x = F.embedding(ids, w.embed)
        taps: dict[int, torch.Tensor] = {}
        if self._kernel is not None:
            call, done = self._kernel.call(x, Spans.of(spans)), 0
            for index in sorted(set(self.taps)) if tapped is not None else ():
                call.run(done, index)
                taps[index] = x[tapped]  # a copy: the kernel updates x in place
                done = index
            call.run(done, len(w.layers))
        else:
            x = self._torch_layers(x, spans, tapped, taps)
        hidden = torch.cat([taps[layer] for layer in self.taps], -1) if tapped is not None else None
        if kept is not None:
            x = x[kept]
            if x.shape[0] == 0:
                return x.new_empty(0, w.head.sizes[0]), hidden
        return w.head(_rms_norm(x, w.norm, w.eps))[0], hidden

    def _torch_layers(
        self, x: torch.Tensor, spans: tuple[Span, ...], tapped: torch.Tensor | None, taps: dict[int, torch.Tensor]
    ) -> torch.Tensor:
        """The linear layers over all rows at once, attention per segment against its own slot; the rows `tapped`
        of the layers in `self.taps` into `taps`."""
        w = self.w
        n = x.shape[0]
        cos, sin = _at_positions(self.cos, spans), _at_positions(self.sin, spans)
        rows = _row_ranges(spans)
        for index, (layer, keys, values) in enumerate(self._layers):
            if tapped is not None and index in self.taps:
                taps[index] = x[tapped]
            q, k, v = layer.qkv(_rms_norm(x, layer.attn_norm, w.eps))
            q = _rotate(q.view(n, w.heads, w.head_dim), cos, sin)
            k = _rotate(k.view(n, w.kv_heads, w.head_dim), cos, sin)
            v = v.view(n, w.kv_heads, w.head_dim)
            attn = [
                self._attend(
                    q[begin:end], k[begin:end], v[begin:end], keys[slot : slot + 1], values[slot : slot + 1], start
                )
                for (slot, start, _), (begin, end) in zip(spans, rows, strict=True)
            ]
            x = x + layer.o((attn[0] if len(attn) == 1 else torch.cat(attn)).reshape(n, w.heads * w.head_dim))[0]
            gate, up = layer.gate_up(_rms_norm(x, layer.mlp_norm, w.eps))
            x = x + layer.down(F.silu(gate) * up)[0]
        return x

    def _attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int
    ) -> torch.Tensor:
        """One segment's rows (n, heads, head_dim) against its slot's cache (1, kv_heads, n_positions, head_dim):
        writes their keys and values at start.., attends to positions 0..each row's own."""
        n, end = q.shape[0], start + q.shape[0]
        keys[0, :, start:end] = k.transpose(0, 1)
        values[0, :, start:end] = v.transpose(0, 1)
        # 4-D inputs: SDPA's CPU kernel (3-D ones fall back to a path ~3x slower per call)
        attn = F.scaled_dot_product_attention(
            q.transpose(0, 1).unsqueeze(0),
            keys[:, :, :end].to(q.dtype),
            values[:, :, :end].to(q.dtype),
            attn_mask=_causal_mask(n, start, q.device),
            is_causal=start == 0 and n > 1,
            enable_gqa=self.w.heads != self.w.kv_heads,
        )
        return attn[0].transpose(0, 1)


def row_chunks(spans: list[Span], limit: int) -> list[tuple[Span, ...]]:
    """The spans in calls of at most `limit` rows, in order; a segment cut at a chunk's end goes on at the next
    chunk's start, from the position after (the earlier chunk has written the keys and values before it)."""
    chunks: list[tuple[Span, ...]] = []
    chunk: list[Span] = []
    room = limit
    for slot, start, count in spans:
        while count:
            take = min(count, room)
            chunk.append((slot, start, take))
            start, count, room = start + take, count - take, room - take
            if room == 0:
                chunks.append(tuple(chunk))
                chunk, room = [], limit
    if chunk:
        chunks.append(tuple(chunk))
    return chunks


def _kept_rows(segments: Sequence[Segment], device: torch.device) -> torch.Tensor | None:
    """The call's rows whose logits are returned (each segment's last `returned_rows`); None when all are."""
    if all(segment.logits_rows is None for segment in segments):
        return None
    return _last_rows(segments, [segment.returned_rows for segment in segments], device)


def _tapped_rows(segments: Sequence[Segment], device: torch.device) -> torch.Tensor | None:
    """The call's rows whose taps are returned (each segment's last `hidden_rows`); None when none are."""
    if all(segment.hidden_rows == 0 for segment in segments):
        return None
    return _last_rows(segments, [segment.hidden_rows for segment in segments], device)


def _last_rows(segments: Sequence[Segment], counts: list[int], device: torch.device) -> torch.Tensor:
    """The indices in the call of each segment's last `counts` rows."""
    rows: list[int] = []
    begin = 0
    for segment, count in zip(segments, counts, strict=True):
        end = begin + int(segment.tokens.shape[0])
        rows += range(end - count, end)
        begin = end
    return torch.tensor(rows, dtype=torch.long, device=device)


def _in_chunk(rows: torch.Tensor | None, begin: int, end: int) -> torch.Tensor | None:
    """The rows of a call that fall in its chunk begin..end, counted from the chunk's start."""
    return None if rows is None else rows[(rows >= begin) & (rows < end)] - begin


def _row_ranges(spans: tuple[Span, ...]) -> list[tuple[int, int]]:
    """Each segment's rows in the call: (first, past the last)."""
    ends = list(itertools.accumulate(count for _, _, count in spans))
    return list(zip([0, *ends[:-1]], ends, strict=True))


def _at_positions(table: torch.Tensor, spans: tuple[Span, ...]) -> torch.Tensor:
    """The rotary table's rows for every row of the call, segment after segment."""
    parts = [table[start : start + count] for _, start, count in spans]
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """LlamaRMSNorm: in fp32, cast back before the weight (in fp32 torch's fused kernel: the same numbers)."""
    if x.dtype == torch.float32:
        return F.rms_norm(x, weight.shape, weight, eps)
    xf = x.float()
    return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """apply_rotary_pos_emb of Hugging Face's Llama on (n, heads, head_dim): x·cos + rotate_half(x)·sin,
    with rotate_half(x) = roll(x, half)·(-1 on the first half), the sign folded into `sin`."""
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, -1), sin)


def _causal_mask(n: int, start: int, device: torch.device) -> torch.Tensor | None:
    """Row i (position start+i) sees positions 0..start+i; None where SDPA needs no mask (one row, or is_causal
    from position 0)."""
    if n == 1 or start == 0:
        return None
    rows = torch.arange(start, start + n, device=device).unsqueeze(1)
    return torch.arange(start + n, device=device).unsqueeze(0) <= rows


@torch.no_grad()
def _rotary_tables(
    rotary: torch.nn.Module, weights: LlamaWeights, n_positions: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sign-folded sin per position, shaped (n_positions, 1, head_dim) to broadcast over heads."""
    positions = torch.arange(n_positions, device=weights.device).unsqueeze(0)
    cos, sin = rotary(weights.embed[:1].unsqueeze(0), positions)
    half = weights.head_dim // 2
    sign = torch.ones(weights.head_dim, dtype=sin.dtype, device=sin.device)
    sign[:half] = -1
    return cos[0].unsqueeze(1), (sin[0] * sign).unsqueeze(1)


def compile_cache_dir() -> str:
    return str(cache_root() / "inductor")


def _compiled(forward: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", compile_cache_dir())
    return torch.compile(forward, dynamic=True)
