"""The one interface the loop needs from a model, whatever runs it (torch or Neuron).

Positions are absolute KV-cache positions of a sequence slot. `score(ids, start)` writes positions
start..start+n-1 of slot 0 and makes every position >= start that held something else stale (Neuron
overwrites by `cache_ids`; the torch backend ignores them until they are overwritten), which is how a
rejected draft is rolled back. A backend holds `slots` sequences at once: `score_batch` scores the tokens
of several sequences (segments) in ONE call, each against its own slot (vLLM v1's flattened layout);
segments never see each other. A backend with compiled shapes (Neuron: `max_score_width` set) pads every
segment of a call to one width, 1 or its compiled k, and the rows of slots not in the call.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from neuron_ssp.errors import Problem, RuntimeProblem

Scored = tuple[torch.Tensor, torch.Tensor | None]  # logits, and the taps of the rows asked for (None: none asked)


@dataclass(frozen=True)
class KvBlock:
    """A copy of one block of positions of a slot's KV cache, every layer, in the backend's own layout: what a
    `PrefixBlocks` backend reads out and writes back (the prefix pool holds them, opaque)."""

    keys: torch.Tensor
    values: torch.Tensor

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.values.nbytes


@dataclass(frozen=True)
class Segment:
    """One sequence's part of a batched call: `tokens` (m,) int64 written at positions start..start+m-1 of
    cache slot `slot`. `logits_rows`: how many of its LAST rows' logits the call returns (None: all m); a
    chunk of a prompt being prefilled wants 0, or 1 when it ends the prompt (the head over the other rows
    would be wasted work). Only backends with a `prompt_chunk` receive it set. `hidden_rows`: how many of its
    LAST rows' hidden states (the taps, `HiddenStates`) a `score_batch_hidden` call returns; 0: none, nothing
    is copied."""

    slot: int
    start: int
    tokens: torch.Tensor
    logits_rows: int | None = None
    hidden_rows: int = 0

    @property
    def returned_rows(self) -> int:
        return len(self.tokens) if self.logits_rows is None else self.logits_rows


@runtime_checkable
class ModelBackend(Protocol):
    name: str
    vocab_size: int
    n_positions: int  # positions per slot: prompt + generated + k must fit
    max_score_width: int | None  # widest window scored in ONE call (Neuron: compiled k); None = any
    slots: int  # sequences the cache holds at once
    # prompt tokens per step when a batching loop prefills prompts in chunks through score_batch, beside the
    # other rows' windows (from position 0 of a fresh slot); None: a prompt whole through prefill_slot
    prompt_chunk: int | None

    def prefill(self, prompt_ids: torch.Tensor) -> torch.Tensor:
        """Encode the prompt (1-D int64) into positions 0..len-1 of slot 0; return the next-token logits (vocab,)."""
        ...

    def score(self, token_ids: torch.Tensor, start: int) -> torch.Tensor:
        """Score 1-D int64 `token_ids` at positions start..start+n-1 of slot 0; float32 logits (n, vocab)."""
        ...

    def prefill_slot(self, slot: int, prompt_ids: torch.Tensor) -> torch.Tensor:
        """`prefill` into `slot`."""
        ...

    def score_batch(self, segments: Sequence[Segment]) -> torch.Tensor:
        """ONE call for every segment (each slot at most once): float32 logits (each segment's returned_rows,
        vocab), rows in segment order."""
        ...


@runtime_checkable
class HiddenStates(Protocol):
    """A backend that also hands out hidden states: for each row asked for, the residual stream ENTERING each tap
    layer (Hugging Face's output_hidden_states[l]; 0 is the embeddings), the taps side by side (rows, taps x
    hidden), float32. What an EAGLE-3 head drafts from (drafters/eagle.py). Told the layers once."""

    num_layers: int  # decoder layers: taps are 0..num_layers-1

    def token_embedding(self) -> torch.Tensor:
        """The model's input embedding (vocab, hidden): an EAGLE head embeds tokens with the target's."""
        ...

    def set_taps(self, layers: Sequence[int]) -> None:
        """The layers whose inputs `*_hidden` calls return, in this order (0 <= layer < the model's layers)."""
        ...

    def prefill_slot_hidden(self, slot: int, prompt_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`prefill_slot`, and the taps of every prompt row (prompt length, taps x hidden)."""
        ...

    def score_batch_hidden(self, segments: Sequence[Segment]) -> tuple[torch.Tensor, torch.Tensor]:
        """`score_batch`, and the taps of each segment's last `hidden_rows` rows, in segment order."""
        ...


@runtime_checkable
class PrefixBlocks(Protocol):
    """A backend whose cache a later request may start from (prefix caching): what a slot holds stays there after its
    request ends, valid for the next request in that slot up to the positions both share, and whole blocks of
    `block_positions` positions copy out of a slot and back into any slot bit for bit (engines/slot_caches.py)."""

    block_positions: int

    def read_block(self, slot: int, index: int) -> KvBlock:
        """A copy of positions index*block_positions.. of `slot`."""
        ...

    def write_block(self, slot: int, index: int, block: KvBlock) -> None:
        """`block` (from read_block) into positions index*block_positions.. of `slot`."""
        ...


class SingleSlot:
    """The batch-1 half of the interface, for backends that hold one sequence (Neuron, wrappers in tools)."""

    slots = 1
    prompt_chunk: int | None = None

    def prefill_slot(self, slot: int, prompt_ids: torch.Tensor) -> torch.Tensor:
        _only_slot_0([slot])
        return self.prefill(prompt_ids)  # type: ignore[attr-defined]

    def score_batch(self, segments: Sequence[Segment]) -> torch.Tensor:
        _only_slot_0([segment.slot for segment in segments])
        return self.score(segments[0].tokens, segments[0].start)  # type: ignore[attr-defined]


def check_slots(slots: Sequence[int], held: int) -> None:
    """Refuse a call with no segment, a slot the cache lacks (C would write past it), or one slot twice (its
    segments would see each other's keys)."""
    if not slots:
        raise ValueError("a call scores at least one segment")
    outside = [slot for slot in slots if not 0 <= slot < held]
    if outside:
        raise ValueError(f"slots {outside}: the cache holds slots 0..{held - 1}")
    if len(set(slots)) != len(slots):
        raise ValueError(f"slots {list(slots)}: a call names each slot at most once")


def check_compiled_room(name: str, n_positions: int, start: int, n: int, why: str = "") -> None:
    """A call on a compiled model writes cache slots start..start+n-1, all below its compiled `n_positions` (`name`:
    the model's config section; `why`: what makes the call that wide, where it is not the tokens alone)."""
    if start + n > n_positions:
        raise RuntimeProblem(
            Problem(
                f"{name}.n_positions",
                n_positions,
                f"scoring cache slots {start}..{start + n - 1} runs past the compiled positions{why}",
                f"raise {name}.n_positions (and recompile) or lower generation.max_new_tokens",
            )
        )


def _only_slot_0(slots: list[int]) -> None:
    if slots != [0]:
        raise ValueError(f"slots {slots}: this backend holds one sequence")


class SlotView(SingleSlot):
    """One slot of a batched backend, seen as a one-sequence backend (a row's draft model)."""

    def __init__(self, backend: ModelBackend, slot: int):
        self.backend = backend
        self.slot = slot

    def prefill(self, prompt_ids: torch.Tensor) -> torch.Tensor:
        return self.backend.prefill_slot(self.slot, prompt_ids)

    def score(self, token_ids: torch.Tensor, start: int) -> torch.Tensor:
        return self.backend.score_batch([Segment(self.slot, start, token_ids)])

    def release(self) -> None:
        """The slot's sequence ended: tell a backend that pads free slots where they cost least."""
        release_slot = getattr(self.backend, "release_slot", None)
        if release_slot is not None:
            release_slot(self.slot)

    def __getattr__(self, name: str) -> Any:
        """name, vocab_size, n_positions, max_score_width, device...: the backend's."""
        return getattr(self.backend, name)
