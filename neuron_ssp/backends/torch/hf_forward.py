"""Hugging Face's own forward with its `DynamicCache`: the path for every model the compact forward
does not cover (sliding-window or biased attention, other architectures), and the reference the
compact forward is checked against.

Rolling back a rejected draft is `DynamicCache.crop(-n)`: the n slots from `start` on are dropped
before the new tokens are scored. A negative count means "remove n" in transformers 4.4x (what
Neuron DLAMIs carry) and is the only form 5.x (what PyPI serves) accepts; what else differs is how a
cache is built (`_new_cache`) and the name of the dtype argument (`load.dtype_kwarg`).

Sliding-window (and linear-attention) cache layers of transformers 5.x keep only the last window of
states and refuse to crop past it, unless past recording is switched on: it is, after the prompt
(as Hugging Face's assisted generation does). Recording layers then keep every state written since
the last rollback; each rollback cuts later than the one before it, so they always hold what it needs.
Sliding-window layers are used only from transformers 5.18 on (`SLIDING_LAYERS_ROLL_BACK`); before, the
cache holds those layers at full length and the attention mask applies the window, as 4.x does.

Several sequences: one DynamicCache per slot, and a batched call scores its segments one after the other
(one forward each, no padding or mask batching): correct and simple, not faster than separate calls.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import torch
import transformers
from packaging.version import Version
from transformers import DynamicCache, PreTrainedModel

from neuron_ssp.backends.base import Scored, Segment
from neuron_ssp.errors import Problem, UsageError

TRANSFORMERS_5 = Version(transformers.__version__).major >= 5
# Whether this transformers' sliding-window cache layers can be rolled back under their attention mask.
# 4.56-5.14's refuse to crop past the window (no past recording); 5.15-5.17's record the past but hand
# attention every state recorded since the last crop while the mask covers the window only, so two calls
# without a rollback between them (the model drafter's one-token steps, a fully accepted window) fail in
# sdpa_attention: "The size of tensor a (7) must match the size of tensor b (6)". 5.18 returns the window.
SLIDING_LAYERS_ROLL_BACK = Version(transformers.__version__).release >= (5, 18)


class HfForward:
    """`slots` sequences, a cache each, through `model(...)`."""

    def __init__(self, model: PreTrainedModel, name: str, slots: int = 1):
        self.model = model
        self.device = next(model.parameters()).device
        self._keep_last = _last_logits_kwarg(model)
        self._cache_name = cache_kwarg(model)
        self._caches: list[DynamicCache | None] = [None] * slots
        self._recording = _needs_past_recording(self._new_cache(), name)
        self.taps: tuple[int, ...] = ()  # layers whose input residual stream a call returns where asked (set_taps)

    def prefill(self, slot: int, prompt_ids: torch.Tensor, hidden: bool = False) -> Scored:
        """The last row's logits, and with `hidden` every row's taps."""
        cache = self._caches[slot] = self._new_cache()
        out = self.model(
            input_ids=prompt_ids.view(1, -1).to(self.device),
            **{self._cache_name: cache},
            use_cache=True,
            output_hidden_states=hidden,
            **self._keep_last,
        )
        if self._recording:  # after the prompt, so a long prompt is not held whole in the window layers
            cache.activate_past_recording()
        return out.logits[0, -1], self._taps(out, prompt_ids.shape[0]) if hidden else None

    def score(self, segments: Sequence[Segment]) -> Scored:
        """Segment after segment, each against its slot's cache; rows in segment order (taps likewise)."""
        parts = [self._score_slot(segment) for segment in segments]
        logits = torch.cat([part for part, _ in parts]) if len(parts) > 1 else parts[0][0]
        if all(segment.hidden_rows == 0 for segment in segments):
            return logits, None
        return logits, torch.cat([taps for _, taps in parts if taps is not None])

    def _score_slot(self, segment: Segment) -> Scored:
        cache = self._caches[segment.slot]
        if cache is None:
            raise RuntimeError("score() before prefill(): the generator must encode the prompt first")
        stale = cache.get_seq_length() - segment.start
        if stale > 0:
            cache.crop(-stale)
        n = segment.tokens.shape[0]
        positions = torch.arange(segment.start, segment.start + n, device=self.device)
        out = self.model(
            input_ids=segment.tokens.view(1, -1).to(self.device),
            **{self._cache_name: cache},
            position_ids=positions.view(1, -1),
            cache_position=positions,
            use_cache=True,
            output_hidden_states=segment.hidden_rows > 0,
        )
        taps = self._taps(out, segment.hidden_rows) if segment.hidden_rows else None
        return out.logits[0][n - segment.returned_rows :], taps

    def _taps(self, out: Any, rows: int) -> torch.Tensor:
        """The last `rows` rows of the tap layers' inputs (output_hidden_states[layer]), side by side."""
        return torch.cat([out.hidden_states[layer][0, -rows:] for layer in self.taps], -1)

    def _new_cache(self) -> DynamicCache:
        if not TRANSFORMERS_5:
            return DynamicCache()  # every layer full length; a sliding window is the mask's job
        cache = DynamicCache(config=self.model.config)
        return cache if SLIDING_LAYERS_ROLL_BACK else _full_length_layers(cache)


def _full_length_layers(cache: DynamicCache) -> DynamicCache:
    """Full-length layers in place of the sliding-window ones, which this transformers cannot roll back.

    The mask still applies the window (it is built from the model's config, and a full layer reports
    every position to it), so the scores are the sliding model's; the cost is the states of the whole
    sequence instead of the last window, as with 4.x and with full-attention models.
    """
    from transformers.cache_utils import DynamicLayer  # 4.56+; only 5.x reaches here

    cache.layers[:] = [DynamicLayer() if getattr(layer, "is_sliding", False) else layer for layer in cache.layers]
    return cache


def _needs_past_recording(cache: DynamicCache, name: str) -> bool:
    """Whether the cache has layers that forget states (sliding window, linear attention), which can be
    rolled back only with past recording; refuse up front where this transformers has none."""
    layers = getattr(cache, "layers", [])  # 4.4x caches have no layer objects, and no window layers
    forgetful = sorted({type(layer).__name__ for layer in layers if hasattr(layer, "record_past")})
    if not forgetful:
        return False
    if not hasattr(cache, "activate_past_recording"):
        raise UsageError(
            Problem(
                f"{name}.path",
                ", ".join(forgetful),
                f"the model's KV cache keeps only a sliding window (or a linear-attention state), and transformers "
                f"{transformers.__version__} cannot roll such a cache back after a rejected draft",
                "install a transformers whose caches have activate_past_recording (5.x), or use a model with "
                "full attention in every layer",
            )
        )
    return True


def cache_kwarg(model: PreTrainedModel) -> str:
    """The forward's name for the KV cache: `cache` from transformers 5.24 on (`past_key_values` is then
    deprecated, with a FutureWarning on every call, and goes in 5.40), `past_key_values` before."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _last_logits_kwarg(model: PreTrainedModel) -> dict[str, int]:
    """Ask for the last position's logits only at prefill (saves the LM head over the whole prompt)."""
    params = inspect.signature(model.forward).parameters
    for name in ("logits_to_keep", "num_logits_to_keep"):  # 4.50+ / 4.45-4.49
        if name in params:
            return {name: 1}
    return {}
