"""The draft vocabulary of an EAGLE-3 head: the most frequent answer tokens, its size chosen by coverage and cost.

SafeAILab (`eagle/traineagle3/cnets.py:536-687`) and SpecForge (`specforge/data/preprocessing.py:587-768`) count
the tokens under the loss mask (the assistant's answers), keep the `draft_vocab_size` most frequent and store
them sorted (d2t: offsets, t2d: a mask; eagle_checkpoint.vocab_maps). They fix the size (32000 for Llama-3);
here it is measured: the share of held-out answer tokens each size covers, against what a head step of that
size costs, and the size that maximises the Leviathan speed estimate is taken.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from neuron_ssp.tools.leviathan import predicted_speedup

SIZES = (1024, 2048, 4096, 8192, 16384, 32768)


def answer_token_counts(ids: list[np.ndarray], answer_start: list[int], vocab_size: int) -> np.ndarray:
    """How often each target id appears in the answers (the tokens the head learns to draft)."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    for tokens, start in zip(ids, answer_start, strict=True):
        counts += np.bincount(tokens[start:], minlength=vocab_size)
    return counts


def top_ids(counts: np.ndarray, size: int) -> torch.Tensor:
    """The `size` most frequent ids (ties: the lower id), sorted ascending (SafeAILab's order)."""
    order = np.lexsort((np.arange(counts.shape[0]), -counts))[:size]
    return torch.from_numpy(np.sort(order)).long()


@dataclass(frozen=True)
class VocabChoice:
    size: int
    coverage: float  # share of held-out answer tokens inside the draft vocabulary
    step_cost: float  # a head step (one row) / a one-token target call, measured
    estimate: float  # Leviathan speed estimate at acceptance alpha x coverage


def coverage_of(counts: np.ndarray, held_out: np.ndarray, size: int) -> float:
    chosen = np.zeros(counts.shape[0], dtype=bool)
    chosen[top_ids(counts, size).numpy()] = True
    total = held_out.sum()
    return float(held_out[chosen].sum() / total) if total else 0.0


def choose_size(
    counts: np.ndarray, held_out: np.ndarray, step_cost: dict[int, float], alpha: float, k: int
) -> tuple[VocabChoice, list[VocabChoice]]:
    """Every size's coverage, cost and estimated speed (expected tokens per call at per-step acceptance
    alpha x coverage, over 1 + (k-1) x cost); the best first, then the table in size order."""
    table = []
    for size, cost in sorted(step_cost.items()):
        cover = coverage_of(counts, held_out, size)
        estimate = predicted_speedup(alpha * cover, k, cost)
        table.append(VocabChoice(size, cover, cost, estimate))
    return max(table, key=lambda row: row.estimate), table


def time_call(call, repeats: int = 20) -> float:
    """Median seconds of `call()` after one warm-up (CPU time: this machine is shared)."""
    call()
    times = []
    for _ in range(repeats):
        begin = time.process_time()
        call()
        times.append(time.process_time() - begin)
    return float(np.median(times))
