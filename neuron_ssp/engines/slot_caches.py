"""The one owner of what the cache slots hold: prefix caching across the requests of a loop.

For each slot it knows which committed tokens the target's cache holds valid at positions 0..n-1, and how many
positions of an EAGLE-3 head's cache (drafters/eagle.py, one slot per target slot) are valid for them. Only
committed tokens count: a call writes a window's drafts too, but the positions of rejected ones are stale, and the
last committed token's keys and values are written by the next call, so a row holds `length - 1` valid positions.

- Warm slots (llama.cpp's --slot-prompt-similarity): a finished request's slot keeps its cache; a new request takes
  the free slot sharing the longest prefix with its prompt (at least a block of it, or all of it but the last
  token: a few tokens are not worth evicting another warm prefix), else the least recently used one, and its prefill
  starts at min(that prefix, the valid positions, prompt length - 1): at least the last prompt token is scored, for
  the logits of the first new token.
- The prefix pool (prefix_pool.py): every whole block of valid positions is copied into host memory as it fills, so
  a request can start from a prefix that no free slot holds (another running request's system prompt, a slot
  since overwritten); restored by copy into the slot it gets, at admission and again before each of its prompt
  chunks (`catch_up`), so requests that arrive together with one system prompt compute it once.
- An EAGLE-3 head's cache is not pooled: a row that drafts from hidden states starts where the head's cache of its
  slot is valid too (`Admission.head`), and the target re-scores from there, so the head receives the target's taps
  of the boundary again (vLLM drops the last matched block for EAGLE likewise, PR #17137).
- A draft model's cache (drafters/model.py) is recomputed: its prefill writes the whole prompt.

Reuse is exact where the backend's rows do not depend on each other (the row kernel: a position's keys and values
depend on the tokens up to it alone, whichever call wrote them), which the tests check bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial

import torch

from neuron_ssp.backends.base import PrefixBlocks
from neuron_ssp.engines.prefix_pool import ROOT, BlockKey, PrefixPool, block_key, chain_keys


@dataclass
class SlotContent:
    """What one slot's caches hold for the tokens `tokens` (the target's positions 0..len-1 valid)."""

    tokens: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.long))
    head: int = 0  # positions of an EAGLE-3 head's cache valid for these tokens
    used: int = 0  # when it was last admitted to (least recently used goes first)
    chain: list[BlockKey] = field(default_factory=list)  # pool keys of its whole blocks, in order


@dataclass(frozen=True)
class Admission:
    """Where a request runs and how much of its prompt is already in that slot's cache."""

    slot: int
    reused: int = 0  # prompt positions the prefill skips
    head: int = 0  # of them, valid in an EAGLE-3 head's cache too: where a row that drafts from taps starts
    from_pool: int = 0  # of `reused`, restored from the pool


class SlotCaches:
    """What every slot of one target holds, for one loop over it (a new loop knows nothing of an earlier one's
    requests, so it reuses nothing). `blocks`: the backend's cache as blocks (None: no prefix caching, every prefill
    from position 0); `pool`: the host-memory pool beyond the slots (None: warm slots only)."""

    def __init__(self, slots: int, blocks: PrefixBlocks | None = None, pool: PrefixPool | None = None):
        self.blocks = blocks
        self.pool = pool if blocks is not None else None
        self.contents = [SlotContent() for _ in range(slots)]
        self._admitted = 0

    @property
    def enabled(self) -> bool:
        return self.blocks is not None

    def admit(self, free: Sequence[int], prompt: torch.Tensor) -> Admission:
        """The free slot for `prompt`, and its prompt positions already valid there: from the free slot sharing the
        longest prefix with it, or restored from the pool where that holds a longer one."""
        self._admitted += 1
        if self.blocks is None:
            return self._take(free[-1], 0, 0)
        room = prompt.shape[0] - 1  # the last prompt token is always scored
        candidates = free[::-1]  # ties go to the slot a loop without prefix caching would take
        shared = {slot: _common_prefix(self.contents[slot].tokens, prompt) for slot in candidates}
        best = max(candidates, key=lambda slot: (min(shared[slot], room), -self.contents[slot].used))
        if min(shared[best], room) < min(self.blocks.block_positions, room):  # a few tokens are not worth a warm slot
            best = min(candidates, key=lambda slot: self.contents[slot].used)
        held = min(shared[best], room)
        # head position p pairs the target's taps at p with token p + 1: valid where both are the prompt's
        head = min(self.contents[best].head, max(shared[best] - 1, 0), held)
        pooled = self._pooled(prompt[:room]) if self.pool is not None else 0
        if pooled > held:
            self._restore(best, prompt, held, pooled)
            return self._take(best, pooled, head, pooled - held)
        return self._take(best, held, head)

    def catch_up(self, slot: int, prompt: torch.Tensor, prefilled: int) -> int:
        """A prompt still being prefilled in chunks: the pool's blocks of it past `prefilled` (another request has
        prefilled them since this one joined: requests that share a system prompt and arrive together compute it
        once) copied into its slot; how many prompt positions its slot now holds."""
        if self.pool is None or self.blocks is None:
            return prefilled
        room = prompt.shape[0] - 1
        pooled = self._pooled(prompt[:room])
        if pooled <= prefilled:
            return prefilled
        self._restore(slot, prompt, prefilled, pooled)
        return pooled

    def written(self, slot: int, tokens: torch.Tensor) -> None:
        """After a call: the committed `tokens` whose keys and values the slot now holds (the prompt prefilled so
        far, or every committed token but the last). Whole blocks go to the pool as they fill."""
        content, blocks = self.contents[slot], self.blocks
        content.tokens = tokens
        if self.pool is None or blocks is None:
            return
        size = blocks.block_positions
        whole = tokens.shape[0] // size
        if whole <= len(content.chain):
            return
        parent = content.chain[-1] if content.chain else ROOT
        for index in range(len(content.chain), whole):
            parent = block_key(parent, tokens[index * size : (index + 1) * size])
            content.chain.append(parent)
            self.pool.add(parent, partial(blocks.read_block, slot, index))
        self.pool.touch(content.chain)

    def left(self, slot: int, tokens: torch.Tensor, head: int = 0) -> None:
        """The slot's request ended with `tokens` valid in the target's cache and `head` positions of its head's."""
        self.written(slot, tokens)
        self.contents[slot].head = min(head, tokens.shape[0])

    def lost(self, slot: int) -> None:
        """The slot's cache can no longer be trusted (a call failed mid-way): nothing of it is reused."""
        self.contents[slot] = SlotContent(used=self.contents[slot].used)

    def _take(self, slot: int, reused: int, head: int, from_pool: int = 0) -> Admission:
        content = self.contents[slot]
        content.used, content.head = self._admitted, 0
        content.tokens = content.tokens[:reused]
        size = self.blocks.block_positions if self.blocks is not None else 1
        del content.chain[reused // size :]
        return Admission(slot, reused, head, from_pool)

    def _pooled(self, prompt: torch.Tensor) -> int:
        """Positions of `prompt` (whole blocks) the pool holds from position 0."""
        assert self.pool is not None and self.blocks is not None
        keys = chain_keys(prompt, self.blocks.block_positions)
        return self.pool.leading(keys) * self.blocks.block_positions

    def _restore(self, slot: int, prompt: torch.Tensor, held: int, pooled: int) -> None:
        """The pool's blocks of `prompt` into `slot` from the block holding position `held` (before it the slot
        already holds the prompt) up to position `pooled`."""
        assert self.pool is not None and self.blocks is not None
        size = self.blocks.block_positions
        keys = chain_keys(prompt[:pooled], size)
        for index in range(held // size, pooled // size):
            self.blocks.write_block(slot, index, self.pool.get(keys[index]))
        self.pool.touch(keys)
        content = self.contents[slot]
        content.tokens, content.chain = prompt[:pooled], keys


def _common_prefix(held: torch.Tensor, prompt: torch.Tensor) -> int:
    """How many tokens `held` and `prompt` share from the first."""
    n = min(held.shape[0], prompt.shape[0])
    if n == 0:
        return 0
    differs = (held[:n] != prompt[:n]).nonzero()
    return int(differs[0]) if differs.numel() else n
