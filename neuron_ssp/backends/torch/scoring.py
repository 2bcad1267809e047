"""Reference backend: a Hugging Face causal LM on CPU or CUDA with a position-addressed KV cache.

Two forwards score the tokens, and plain decoding and speculative sampling use the same one, so every
speedup compares like with like:
- `compact` (llama_forward.py): our forward of a plain Llama over the model's weights with a
  preallocated cache, on the row kernel (or oneDNN-packed) on a CPU in fp32, optionally through
  torch.compile (slower than eager on an H100: llama_forward.py);
- `hf` (hf_forward.py): the model's own forward with a DynamicCache, for every other model.
`auto` takes compact wherever it covers the model.

Both hold `slots` sequences (a cache each, preallocated by the compact forward: `kv_cache_bytes`), and
`score_batch` scores segments of several in one call; `prefill` and `score` are slot 0's.

Logits stay on the model's device: on CUDA the sampler draws there and only token ids cross to the
host, not (n, vocab) floats per call.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from typing import Literal

import torch
from transformers import PreTrainedModel

from neuron_ssp.backends.base import PrefixBlocks, Segment, check_slots
from neuron_ssp.backends.torch.hf_forward import HfForward
from neuron_ssp.backends.torch.llama_forward import CompactLlama
from neuron_ssp.backends.torch.llama_weights import can_pack, llama_weights, unsupported_reason
from neuron_ssp.backends.torch.row_kernel import KEY_TILE, Panels, key_tiles
from neuron_ssp.errors import Problem, UsageError

ForwardName = Literal["auto", "compact", "hf"]


class TorchBackend:
    """`slots` sequences, one cache. Two backends may share a model (draft = target) but never a cache."""

    max_score_width: int | None = None

    def __init__(
        self,
        model: PreTrainedModel,
        n_positions: int,
        name: str = "torch",
        forward: ForwardName = "auto",
        compile: bool = False,
        pack: bool | None = None,
        slots: int = 1,
        prompt_chunk: int = 0,
        kv_dtype: torch.dtype = torch.float32,
        blocks: Mapping[str, Panels] | None = None,
    ):
        """`pack`: oneDNN-packed weights for the compact forward; None packs where it pays (CPU, fp32).
        `prompt_chunk`: chunked prefill in the batching loop (platform.prefill_chunk; 0: whole prompts).
        `kv_dtype`: what the compact forward's KV cache holds (platform.kv_dtype); Hugging Face's cache holds the
        model's dtype. `blocks`: the model's GGUF's matrices as block panels (platform.weights auto, block_panels.py):
        the row kernel reads those instead of the fp32 weights, the same numbers."""
        self.model = model
        self.name = name
        self.slots = slots
        self.device = next(model.parameters()).device
        self.vocab_size = int(model.get_output_embeddings().out_features)
        self.n_positions = capped_positions(model, n_positions)
        self.forward_name = _pick_forward(model, forward, compile, name)
        self._forward: CompactLlama | HfForward
        if self.forward_name == "hf":
            self._forward = HfForward(model, name, slots)
        else:
            weights = llama_weights(model, can_pack(model) and not compile if pack is None else pack, blocks)
            self._forward = CompactLlama(weights, model.model.rotary_emb, self.n_positions, compile, slots, kv_dtype)
        # chunked prefill needs a cache addressed by position from a fresh slot: ours, not a DynamicCache's
        self.prompt_chunk = prompt_chunk if prompt_chunk and self.forward_name == "compact" else None

    def prefill(self, prompt_ids: torch.Tensor) -> torch.Tensor:
        return self.prefill_slot(0, prompt_ids)

    def score(self, token_ids: torch.Tensor, start: int) -> torch.Tensor:
        return self.score_batch([Segment(0, start, token_ids)])

    @torch.inference_mode()
    def prefill_slot(self, slot: int, prompt_ids: torch.Tensor) -> torch.Tensor:
        check_slots([slot], self.slots)
        return self._forward.prefill(slot, prompt_ids)[0].float()

    @torch.inference_mode()
    def score_batch(self, segments: Sequence[Segment]) -> torch.Tensor:
        """On the row kernel a row's logits are bit-identical to scoring its segment alone; elsewhere equal
        within rounding (llama_forward.py, hf_forward.py say why)."""
        check_slots([segment.slot for segment in segments], self.slots)
        return self._forward.score(segments)[0].float()

    @property
    def weights_from_blocks(self) -> bool:
        """Whether the row kernel reads the model's GGUF blocks (platform.weights auto) rather than fp32 weights."""
        return isinstance(self._forward, CompactLlama) and self._forward.w.from_blocks

    @property
    def prefix_blocks(self) -> PrefixBlocks | None:
        """The cache as a base.PrefixBlocks (prefix caching): the compact forward's on the row kernel, whose rows do
        not depend on the call they are in, so a position's keys and values are the same whichever request wrote
        them. None elsewhere: the torch path's GEMMs round differently for other row counts (a hit could change an
        answer in its last bits), and Hugging Face's DynamicCache is rebuilt at each prefill."""
        forward = self._forward
        return forward if isinstance(forward, CompactLlama) and forward.on_row_kernel else None

    @property
    def num_layers(self) -> int:
        return int(self.model.config.num_hidden_layers)

    def token_embedding(self) -> torch.Tensor:
        return self.model.get_input_embeddings().weight

    def set_taps(self, layers: Sequence[int]) -> None:
        """base.HiddenStates: the layers whose inputs the `*_hidden` calls return."""
        outside = [layer for layer in layers if not 0 <= layer < self.num_layers]
        if outside or not layers:
            raise ValueError(f"tap layers {list(layers)}: {self.name} has layers 0..{self.num_layers - 1}")
        self._forward.taps = tuple(layers)

    @torch.inference_mode()
    def prefill_slot_hidden(self, slot: int, prompt_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        check_slots([slot], self.slots)
        self._check_taps()
        logits, taps = self._forward.prefill(slot, prompt_ids, hidden=True)
        assert taps is not None
        return logits.float(), taps.float()

    @torch.inference_mode()
    def score_batch_hidden(self, segments: Sequence[Segment]) -> tuple[torch.Tensor, torch.Tensor]:
        """`score_batch`, and each segment's last `hidden_rows` rows' taps (0 rows where no segment asks)."""
        check_slots([segment.slot for segment in segments], self.slots)
        self._check_taps()
        logits, taps = self._forward.score(segments)
        width = len(self._forward.taps) * int(self.model.config.hidden_size)
        return logits.float(), logits.new_empty(0, width) if taps is None else taps.float()

    def _check_taps(self) -> None:
        if not self._forward.taps:
            raise RuntimeError(f"{self.name}: set_taps before asking for hidden states")


def kv_cache_bytes(model: PreTrainedModel, slots: int, n_positions: int, kv_dtype: torch.dtype = torch.float32) -> int:
    """The keys and values of `slots` sequences of n_positions in `kv_dtype` (`cache_dtype`): what the compact
    forward allocates at construction (exactly with the row kernel, whose keys fill whole tiles of KEY_TILE
    positions; at most that much less without it) and Hugging Face's caches grow to, so a loader can refuse a slot
    count that does not fit before allocating it."""
    config = model.config
    n_positions = capped_positions(model, n_positions)
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    element = kv_dtype.itemsize
    positions = n_positions + key_tiles(n_positions) * KEY_TILE
    return int(config.num_hidden_layers) * slots * kv_heads * head_dim * positions * element


def cache_dtype(model: PreTrainedModel, forward: ForwardName, kv_dtype: torch.dtype) -> torch.dtype:
    """What a backend's cache will hold: `kv_dtype` on the compact forward, the model's dtype on Hugging Face's."""
    if forward == "hf" or unsupported_reason(model) is not None:
        return next(model.parameters()).dtype
    return kv_dtype


def capped_positions(model: PreTrainedModel, n_positions: int) -> int:
    """Positions per slot: no more than the model was trained for."""
    return min(n_positions, int(getattr(model.config, "max_position_embeddings", n_positions)))


def _pick_forward(model: PreTrainedModel, forward: ForwardName, compile: bool, name: str) -> str:
    """'compact' or 'hf'; a config that asks for what this model cannot do is refused with the reason."""
    if forward == "hf" and compile:
        raise ValueError("compile applies to the compact forward only (PlatformConfig refuses forward: hf with it)")
    reason = unsupported_reason(model)
    if compile and next(model.parameters()).device.type == "cpu" and not _has_cxx():
        raise UsageError(
            Problem(
                "platform.compile",
                True,
                "torch.compile on a CPU (inductor) builds C++ kernels, "
                f"and no C++ compiler ({os.environ.get('CXX', 'g++')}) is on PATH",
                "install g++ (apt-get install g++) or set platform.compile: false",
            )
        )
    if reason is None and forward != "hf":
        return "compact"
    if forward == "compact" or compile:
        field, value = ("platform.compile", True) if compile and forward != "compact" else ("platform.forward", forward)
        raise UsageError(
            Problem(
                field,
                value,
                f"the compact forward cannot run {name}: {reason}",
                "set platform.forward: hf (Hugging Face's forward) and compile: false",
            )
        )
    return "hf"


def _has_cxx() -> bool:
    return shutil.which(os.environ.get("CXX", "g++")) is not None
