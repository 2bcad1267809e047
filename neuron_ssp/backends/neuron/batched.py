"""`ModelBackend` over a `LlamaForSampling` compiled for batch B with continuous batching: B cache slots, every
row of a step scored in ONE call. Read from transformers-neuronx at 1ade6d7 (0.13.x):

- Loaded with `NeuronConfig(continuous_batching=ContinuousBatchingConfig(batch_size_for_shared_caches=B))`
  (load.py): the KV cache holds B sequences, `start_ids` name the sequence (cache row) each input row reads
  and writes, cache_ids are 2-D (batch, n) (config.py lines 272-275 force the left-aligned layout); context
  encoding is compiled at batch 1 (llama/model.py lines 83-84), token generation and each speculation
  network at batch B (`enable_speculative_decoder(k, batch_sizes=B)`, base.py lines 122-132).
- prefill_slot: `forward(ids (1, P), cache_ids (1, P) = 0..P-1, start_ids=[slot])`, the context branch of
  `_prepare_for_continuous_batching` (base.py lines 502-537), which writes that slot only. Two exceptions:
  a prompt longer than the largest context bucket is refused there (`assert n_active_tokens <=
  continuous_batching_n_positions`, line 508; buckets: topology/networks.py), so its rest is scored in
  windows; and a ONE-token prompt takes the token-generation branch, which pads the batch with token 0 at
  cache id 0 for every other sequence (lines 575-587), overwriting their first position, so it is scored
  as a full batch like any one-token step.
- score_batch: every call carries all B rows in slot order, `start_ids` 0..B-1, so the library's own
  padding (lines 575-587) has nothing to add. A call has one width: 1 when every segment is one token (the
  token-generation network), else the compiled k (`speculative_forward(..., speculation_length=k)`, whose
  `speculation_batches` assertion, line 549, wants the compiled batch). A shorter segment repeats its last
  token into the rest of the window; a slot with no segment gets token 0: a running row's (its draft not
  scored this call) at positions from its `end` on, a released slot's (`release_slot`: its row left) at
  position 0, or 1..k in a window. Both write only positions that are stale by contract: each slot's `end` is
  one past its last written token, and its next call starts at or before it; a released slot holds nothing.
  A free slot costs nothing there: the token bucket of a call is chosen by the LARGEST cache id of all its
  rows (decoder.py:490, :538-546), so a slot left at its old end would drag every running row into the
  largest bucket its last request reached.
  A window reads the cache below the row's smallest cache id and its own tokens causally by index (hlo.py
  lines 3507-3604), so a padded position never reaches a real token's logits; padding that would run past the
  cache is put on the last position, which only the call writing it ever reads.
  The library tells a window from a context encoding by the FIRST cache id of the FIRST row (base.py
  lines 502 and 539): it must not be 0, so no window starts at position 0 and a padding row at 1 or later.
  cache_ids are sent in the input ids' dtype: the token-generation branch scatters one into the other
  (line 585, `scatter_` refuses mixed dtypes).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from neuron_ssp.backends.base import Segment, check_slots
from neuron_ssp.backends.neuron.scoring import NeuronBackend
from neuron_ssp.topology.networks import context_buckets

PAD_TOKEN = 0  # what the library's own padding feeds (base.py line 576)


class BatchedNeuronBackend(NeuronBackend):
    """`slots` sequences on one model; knows nothing of acceptance."""

    def __init__(
        self,
        model: Any,
        name: str,
        vocab_size: int,
        n_positions: int,
        speculation_length: int | None,
        compiled_windows: list[int] | None = None,
        *,
        slots: int,
    ):
        super().__init__(model, name, vocab_size, n_positions, speculation_length, compiled_windows)
        self.slots = slots
        self.longest_context = context_buckets(n_positions)[-1]
        self._end = [0] * slots  # per slot: one past its last written token; shared by with_window copies

    @torch.inference_mode()
    def prefill_slot(self, slot: int, prompt_ids: torch.Tensor) -> torch.Tensor:
        check_slots([slot], self.slots)
        length = prompt_ids.shape[0]
        self._check_room(0, length)
        if length == 1:
            return self.score_batch([Segment(slot, 0, prompt_ids)])[-1]
        head = min(length, self.longest_context)
        logits = self.model.forward(
            prompt_ids[:head].view(1, -1),
            cache_ids=torch.arange(head, dtype=prompt_ids.dtype).view(1, -1),
            start_ids=torch.tensor([slot], dtype=torch.int32),
        )[0, : self.vocab_size].float()
        self._end[slot] = head
        if head < length:  # the rest in windows at the slot's own positions, the other slots padded
            logits = self.score_batch([Segment(slot, head, prompt_ids[head:])])[-1]
        return logits

    @torch.inference_mode()
    def score_batch(self, segments: Sequence[Segment]) -> torch.Tensor:
        check_slots([segment.slot for segment in segments], self.slots)
        for segment in segments:
            self._check_room(segment.start, segment.tokens.shape[0])
        k = self.speculation_length
        longest = max(segment.tokens.shape[0] for segment in segments)
        width = k if k and longest > 1 else 1
        scored: list[list[torch.Tensor]] = [[] for _ in segments]
        for offset in range(0, longest, width):  # one call, unless a segment is wider than the window
            parts = {
                s.slot: (s.start + offset, s.tokens[offset : offset + width])
                for s in segments
                if s.tokens.shape[0] > offset
            }
            logits = self._call(parts, width)
            for rows, segment in zip(scored, segments, strict=True):
                if segment.slot in parts:
                    start, tokens = parts[segment.slot]
                    rows.append(logits[segment.slot][: tokens.shape[0]])
                    self._end[segment.slot] = start + tokens.shape[0]
        return torch.cat([torch.cat(rows) for rows in scored])

    def release_slot(self, slot: int) -> None:
        """`slot`'s sequence ended: every position of it is stale, so it is padded at the start of the cache."""
        check_slots([slot], self.slots)
        self._end[slot] = 0

    def prefill(self, prompt_ids: torch.Tensor) -> torch.Tensor:
        """Slot 0's, like `score`: what the self-test and the cost timing drive."""
        return self.prefill_slot(0, prompt_ids)

    def score(self, token_ids: torch.Tensor, start: int) -> torch.Tensor:
        return self.score_batch([Segment(0, start, token_ids)])

    def _call(self, parts: dict[int, tuple[int, torch.Tensor]], width: int) -> list[torch.Tensor]:
        """One call of `width` over every slot: `parts` maps a slot to (start, its tokens); returns each slot's
        logits (width, vocab)."""
        input_ids, cache_ids, seq_ids = call_inputs(parts, self._end, width, self.n_positions)
        if width == 1:
            logits = self.model.forward(input_ids, cache_ids=cache_ids, start_ids=seq_ids)  # (B, vocab)
            return [row[: self.vocab_size].float().view(1, -1) for row in logits]
        logits = self.model.speculative_forward(
            input_ids, cache_ids=cache_ids, start_ids=seq_ids, speculation_length=width
        )  # (k, vocab, B)
        return [logits[:, : self.vocab_size, slot].float() for slot in range(self.slots)]


def call_inputs(
    parts: dict[int, tuple[int, torch.Tensor]], ends: list[int], width: int, n_positions: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, cache_ids, start_ids) of one call of `width` over every slot (`ends`: one past each slot's last
    written position): `parts` maps a slot to (start, its tokens), the other slots are padded (module docstring).
    What the loader's probe (probe.py) hands the installed library's preprocessing is exactly this."""
    slots = len(ends)
    input_ids = torch.full((slots, width), PAD_TOKEN, dtype=torch.int64)
    cache_ids = torch.empty((slots, width), dtype=torch.int64)
    for slot in range(slots):
        if slot in parts:
            start, tokens = parts[slot]
            if width > 1 and start == 0:
                raise ValueError(
                    f"slot {slot}: a window at position 0 would be taken for a context encoding; "
                    "prefill_slot encodes a prompt"
                )
            input_ids[slot, : tokens.shape[0]] = tokens
            input_ids[slot, tokens.shape[0] :] = tokens[-1]
        else:
            start = max(ends[slot], 1) if width > 1 else ends[slot]
        cache_ids[slot] = torch.arange(start, start + width).clamp(max=n_positions - 1)
    return input_ids, cache_ids, torch.arange(slots, dtype=torch.int32)
