"""Prompt lookup: propose what followed the latest earlier occurrence of the last n tokens.

Model-free, so it costs microseconds; it shines where the output copies the input (summaries,
rewrites, code edits, RAG) and proposes nothing on open-ended text, where nothing matches.
"""

from __future__ import annotations

import torch

from neuron_ssp.drafters.base import Draft, point_masses
from neuron_ssp.speculation.position_noise import PositionNoise


class NgramDrafter:
    def __init__(self, vocab_size: int, ngram_max: int = 3, ngram_min: int = 1):
        self.vocab_size = vocab_size
        self.ngram_max = ngram_max
        self.ngram_min = ngram_min

    def begin(self, prompt_ids: torch.Tensor, max_new_tokens: int, noise: PositionNoise | None = None) -> None:
        """Nothing to encode: the lookup reads the sequence passed to `propose`."""

    def finish(self, sequence: torch.Tensor) -> None:
        """Prompt lookup learns nothing across requests."""

    def propose(self, sequence: torch.Tensor, max_tokens: int) -> Draft:
        tokens, n = lookup_match(sequence, max_tokens, self.ngram_max, self.ngram_min)
        return Draft(tokens, point_masses(tokens, self.vocab_size), n, deterministic=True)


def lookup_match(sequence: torch.Tensor, max_tokens: int, ngram_max: int, ngram_min: int) -> tuple[torch.Tensor, int]:
    """(proposal, n of the n-gram matched; 0 when none matched). Longest n first; among matches of that n,
    the latest one that has a continuation.

    The continuation is an overlapping copy (as in LZ77): where it runs into the end of the sequence
    it goes on copying what it has just proposed, i.e. it repeats the last `length - start` tokens.
    So a run `1 1 1 ...`, whose latest match is one token back, drafts the whole window of 1s
    instead of a single token.
    """
    length = sequence.shape[0]
    for n in range(min(ngram_max, length - 1), ngram_min - 1, -1):
        pattern = sequence[length - n :]
        windows = sequence[: length - 1].unfold(0, n, 1)  # every earlier n-gram, continuation exists
        hits = (windows == pattern).all(dim=1).nonzero()
        if hits.numel():
            return overlapping_copy(sequence, int(hits[-1]) + n, max_tokens), n
    return sequence.new_empty(0), 0


def overlapping_copy(sequence: torch.Tensor, start: int, max_tokens: int) -> torch.Tensor:
    """`max_tokens` tokens copied from `start` on, repeating `sequence[start:]` past the sequence's end."""
    period = sequence[start:]
    repeats = -(-max_tokens // period.shape[0])
    return period.repeat(repeats)[:max_tokens].clone()
