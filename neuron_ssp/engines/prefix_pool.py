"""Whole blocks of committed KV in host memory beyond the slots, keyed as vLLM keys them, evicted least recently used.

A block is the keys and values of `block_positions` positions of one sequence. Its key hashes its parent's key
(the block before it) and its own tokens, so equal keys mean equal tokens from position 0 on: on a backend whose
rows do not depend on each other (the row kernel), equal KV bit for bit, whichever request wrote it. vLLM keys
blocks the same way (`vllm/v1/core/kv_cache_utils.py` hash_block_tokens: parent hash, the block's tokens) and
caches only full blocks of computed tokens, never drafts; so does this pool. Keys are SHA-256 digests: a collision
would hand one request another's KV, so no 64-bit hash.

The pool holds at most `budget_bytes`; adding past it evicts the least recently used blocks. A chain is touched
from its last block to its first, so a shared prefix (a system prompt) is the last part of it to go, as vLLM's free
queue orders blocks (tail first).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Sequence

import torch

from neuron_ssp.backends.base import KvBlock

BlockKey = bytes
ROOT: BlockKey = b""  # the parent of a sequence's first block
MB = 1 << 20
DEFAULT_SHARE, DEFAULT_CAP_MB, UNKNOWN_FREE_MB = 0.25, 4096, 1024  # platform.prefix_pool_mb None


def default_budget_bytes() -> int:
    """platform.prefix_pool_mb None: a quarter of the memory available now (Linux's MemAvailable: free memory plus
    what the page cache would give back), at most DEFAULT_CAP_MB; UNKNOWN_FREE_MB where the system does not say."""
    return min(int(available_bytes() * DEFAULT_SHARE), DEFAULT_CAP_MB * MB)


def available_bytes() -> int:
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(UNKNOWN_FREE_MB / DEFAULT_SHARE) * MB


def block_key(parent: BlockKey, tokens: torch.Tensor) -> BlockKey:
    """The key of a block holding `tokens` after the block keyed `parent`."""
    return hashlib.sha256(parent + tokens.to(torch.int64).numpy().tobytes()).digest()


def chain_keys(tokens: torch.Tensor, block_positions: int, parent: BlockKey = ROOT) -> list[BlockKey]:
    """The keys of every whole block of `tokens`, in order."""
    keys = []
    for begin in range(0, tokens.shape[0] - block_positions + 1, block_positions):
        parent = block_key(parent, tokens[begin : begin + block_positions])
        keys.append(parent)
    return keys


class PrefixPool:
    """Blocks by key, at most `budget_bytes` of them, least recently used first out."""

    def __init__(self, budget_bytes: int):
        self.budget_bytes = budget_bytes
        self._blocks: OrderedDict[BlockKey, KvBlock] = OrderedDict()
        self.bytes = 0
        self.evicted = 0  # blocks evicted so far

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, key: BlockKey) -> bool:
        return key in self._blocks

    def leading(self, keys: Sequence[BlockKey]) -> int:
        """How many of `keys`, from the first, the pool holds (a chain is usable up to its first missing block)."""
        held = 0
        for key in keys:
            if key not in self._blocks:
                break
            held += 1
        return held

    def get(self, key: BlockKey) -> KvBlock:
        return self._blocks[key]

    def add(self, key: BlockKey, read: Callable[[], KvBlock]) -> None:
        """The block `read` returns under `key`, unless held already (then nothing is read); least recently used
        blocks go until the pool is within its budget again. A block larger than the whole budget is not kept."""
        if key in self._blocks:
            return
        block = read()
        if block.nbytes > self.budget_bytes:
            return
        self._blocks[key] = block
        self.bytes += block.nbytes
        while self.bytes > self.budget_bytes:
            _, dropped = self._blocks.popitem(last=False)
            self.bytes -= dropped.nbytes
            self.evicted += 1

    def touch(self, keys: Sequence[BlockKey]) -> None:
        """`keys` were used: most recently used, the first of them most of all (it is the last to go)."""
        for key in reversed(keys):
            if key in self._blocks:
                self._blocks.move_to_end(key)
