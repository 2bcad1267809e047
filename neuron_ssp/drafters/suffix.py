"""Suffix decoding: draft what followed the current context in this request or in earlier ones.

SuffixDecoding (Oliaro et al., NeurIPS 2025; Snowflake's ArcticInference) drafts without a model
from suffix trees. Two sources are scored together, as ArcticInference does:

- this request's prompt and output so far (a fresh tree per request, grown as tokens commit);
- a global history of earlier requests (prompt + output), shared by every request of the process,
  added when a request finishes, bounded by `cache_tokens` (oldest request evicted first) and
  optionally persisted to a file.

Each source proposes a continuation of its longest matching context, and the one with the higher
score (expected accepted tokens: the sum of cumulative probabilities) wins, as in ArcticInference.
Two choices differ from it, both measured on half of the dev prompts (docs/benchmarks.md):

- the request's own tree drafts the continuation seen last, like prompt lookup, and the history the
  most frequent one: within one text the latest occurrence predicts best (rag, summaries), across
  requests agreement does;
- the history drafts only after `min_history_match` tokens matched: a short context that occurred
  once in an unrelated request mostly drafts tokens the target rejects, and on a CPU each rejected
  draft still costs a wide target call.

Threads: the global history is guarded by one lock, so a request finishing never changes it under
a draft running on another thread. The per-request tree is this drafter's own state, like a draft
model's KV cache: one generation at a time per drafter (as per pipeline).
"""

from __future__ import annotations

import logging
import threading
from collections import deque

import torch

from neuron_ssp.config import SuffixConfig
from neuron_ssp.drafters.base import Draft, point_masses
from neuron_ssp.drafters.suffix_store import HistoryFile, HistoryFileError
from neuron_ssp.drafters.suffix_tree import DraftPath, SuffixTree
from neuron_ssp.errors import Problem
from neuron_ssp.speculation.position_noise import PositionNoise
from neuron_ssp.speculation.sampling import SamplingParams

log = logging.getLogger(__name__)


class SuffixHistory:
    """The global tree of finished requests: bounded, evicted oldest first, optionally on disk."""

    def __init__(self, settings: SuffixConfig, store: HistoryFile | None = None):
        self.settings = settings
        self.tree = SuffixTree(settings.max_depth)
        self.lock = threading.Lock()
        self.store = store
        self._order: deque[int] = deque()  # sequence ids, oldest first
        self.load_problem: Problem | None = None
        if store is not None:
            self._load(store)

    def add(self, tokens: list[int]) -> None:
        """Learn a finished request (its last `cache_tokens` tokens at most), then evict to the bound."""
        limit = self.settings.cache_tokens
        tokens = tokens[-limit:] if limit else []
        if not tokens:
            return
        with self.lock:
            self._order.append(self.tree.add(tokens))
            self._evict()
            if self.store is not None:
                self._save(tokens)

    def speculate(self, context: list[int], max_tokens: int) -> DraftPath:
        s = self.settings
        min_match = max(s.min_match, s.min_history_match)
        with self.lock:
            return self.tree.speculate(context, max_tokens, s.max_spec_factor, s.min_token_prob, min_match)

    def clear(self) -> None:
        with self.lock:
            self.tree = SuffixTree(self.settings.max_depth)
            self._order.clear()

    @property
    def stored_tokens(self) -> int:
        return self.tree.stored_tokens

    def _evict(self) -> None:
        while self.tree.stored_tokens > self.settings.cache_tokens and self._order:
            self.tree.remove(self._order.popleft())

    def _save(self, tokens: list[int]) -> None:
        assert self.store is not None
        try:
            self.store.append(tokens)
        except OSError as exc:
            log.warning(
                "%s",
                Problem(
                    "speculation.suffix.persist_path",
                    str(self.store.path),
                    f"the history could not be saved ({exc}); it stays in memory only",
                    "point persist_path at a writable file",
                ),
            )

    def _load(self, store: HistoryFile) -> None:
        try:
            sequences = store.load()
        except HistoryFileError as exc:
            aside = _set_aside(store)
            self.load_problem = Problem(
                "speculation.suffix.persist_path",
                str(store.path),
                f"the saved history is unusable: {exc}",
                f"the drafter starts with an empty history; {aside}",
            )
            log.warning("%s", self.load_problem)
            return
        for tokens in sequences:
            self._order.append(self.tree.add(tokens))
        before = len(self._order)
        self._evict()
        if len(self._order) < before:  # the file outgrew cache_tokens: keep it at what memory holds
            store.rewrite(self.tree.sequences())


def _set_aside(store: HistoryFile) -> str:
    try:
        return f"the bad file was renamed to {store.set_aside()} and a new one is started"
    except OSError as exc:
        return f"the bad file could not be renamed ({exc}): move or delete it by hand"


class SuffixDrafter:
    def __init__(self, vocab_size: int, settings: SuffixConfig, history: SuffixHistory | None = None):
        self.vocab_size = vocab_size
        self.settings = settings
        self.history = history if history is not None else SuffixHistory(settings)
        self._local = self._request_tree()
        self._sid = self._local.open()
        self._seen = 0  # committed tokens already in the local tree

    def begin(self, prompt_ids: torch.Tensor, max_new_tokens: int, noise: PositionNoise | None = None) -> None:
        """A fresh tree for this request, holding its prompt (a model-free drafter needs no cache room)."""
        self._local = self._request_tree()
        self._sid = self._local.open()
        self._local.extend(self._sid, prompt_ids.tolist())
        self._seen = prompt_ids.shape[0]

    def propose(self, sequence: torch.Tensor, max_tokens: int) -> Draft:
        length = sequence.shape[0]
        if length > self._seen:
            self._local.extend(self._sid, sequence[self._seen :].tolist())
            self._seen = length
        context = sequence[-self.settings.max_depth :].tolist()
        path = self.best_path(context, max_tokens)
        tokens = torch.tensor(path.tokens, dtype=torch.long)
        return Draft(tokens, point_masses(tokens, self.vocab_size), path.match_len, deterministic=True)

    def best_path(self, context: list[int], max_tokens: int) -> DraftPath:
        """The higher-scoring of the two sources' drafts; this request's own text wins a tie."""
        s = self.settings
        local = self._local.speculate(context, max_tokens, s.max_spec_factor, s.min_token_prob, s.min_match)
        shared = self.history.speculate(context, max_tokens)
        return shared if shared.score > local.score else local

    def for_row(self, slot: int, sampling: SamplingParams, rng: torch.Generator | None) -> SuffixDrafter:
        """A fresh tree for the row's request over the shared history."""
        return SuffixDrafter(self.vocab_size, self.settings, self.history)

    def finish(self, sequence: torch.Tensor) -> None:
        """The request is done: its prompt and output join the global history."""
        self.history.add(sequence.tolist())
        self._local = self._request_tree()
        self._sid = self._local.open()
        self._seen = 0

    def _request_tree(self) -> SuffixTree:
        return SuffixTree(self.settings.max_depth, prefer_recent=True)
