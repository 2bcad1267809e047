"""`speculation.engine: library`: transformers-neuronx's own `SpeculativeGenerator` loop, our acceptor.

Useful to compare our loop with AWS's on the same compiled models. The library's loop differs from
ours in ways that matter, so they are handled or refused here, not discovered later:
- it drafts greedily (`DraftModelForSpeculation`, argmax), so the draft distribution is a point mass
  on each drafted token; the acceptor is given exactly that, which keeps rejection sampling lossless.
  Each row's acceptor draws from that row's per-position noise (position_noise.py), so a seeded row's
  tokens do not depend on the batch around it;
- its first token after the prompt is the target's argmax, whatever the sampling settings
  (`sampling.select_tokens(target_scores)`, speculation.py:744 at 1ade6d7);
- from SDK 2.21 it wants a zero-padded `(bs, k)` result and counts it with `count_nonzero` (:823), so an
  accepted token id 0 would be miscounted: that row stops with a message instead of a wrong text;
- it always drafts k-1 tokens (policy 'fixed' only) and returns the tokens at the end: they reach the
  callbacks after the call, one iteration at a time (engines/static_batch.py);
- it scores a full window from a slot that may reach sequence_length - 1 and refills the draft one slot
  past it: target and draft each need P+N+k-1 positions (neuron_ssp.topology.positions);
- `sample(eos_token_id=...)` takes ONE id (it compares tensors element-wise). Models such as Llama-3
  have several, so our acceptor rewrites any other EOS it accepts into that one, which stops the
  library's loop there, and the engine puts the real id back;
- on 0.10-0.11 (7a30b42, c8d6bdc) the loop hands the last <= k tokens to `target.sample(..., top_k=1)`:
  greedy, whatever the sampling settings (a warning says so). Those builds run batch 1 only
  (speculation.py:346-347 raises for more).

Batch > 1 (1ade6d7, `sample(..., attention_mask=...)`, speculation.py:677-867): the prompts are padded on
the RIGHT and the mask marks the real tokens. The loop derives everything per row from it: context
`cache_ids = arange(len) * mask` (:728, so a row's tokens sit at 0..P-1), the row's first new token at
`count_nonzero(mask)` = P (:767-771), start_ids = sequence ids arange(bs) (:729-730). Each row's window
is `cache_ids + arange(k)` (:802); its output is `tokens[row, P:]`, one `sequence_length` for all rows
(the longest budget; shorter rows are cut here), a row stops at the single EOS id (:828-845) or at
sequence_length (:860-862). Sampling stays per row: the acceptor (ours) sees every row (:817). Two things
in that loop are wrong for rows that move differently, and are worked around:
- `target_next_ids = accepted_tokens[:, lengths - 1][:, 0]` (:836-838) feeds EVERY row the token at row
  0's accepted length. So every row commits the same number of tokens per call: the shortest
  continuing row's (truncating an accepted prefix is lossless, and seeded noise is per position);
  rows that end in the call are padded with the EOS id to that length. `LibraryLanes.see_window` checks each
  window's first token against what its row committed;
- `DraftModelForSpeculation` drafts every row's 2nd..(k-1)th token at row 0's positions (:335
  `start_len = cache_ids[0][0]`, :356 `cache_ids = [next_len] * batch_size`): we pass the library a
  draft provider that advances each row from its own position (`row_aligned_draft`), call for call
  the library's at batch 1.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import torch

from neuron_ssp.backends.neuron.api import NeuronxApi, load_neuronx
from neuron_ssp.backends.neuron.scoring import NeuronBackend
from neuron_ssp.config import Config, SamplingConfig
from neuron_ssp.drafters.base import point_masses
from neuron_ssp.drafters.registry import drafter_kind
from neuron_ssp.engines.base import sampling_params
from neuron_ssp.engines.rows import Row, RowRequest, RowSettings
from neuron_ssp.engines.static_batch import (
    CallTimes,
    IterationPiece,
    RowOutput,
    StaticBatchEngine,
    pad_id,
    padded_batch,
    require_one_context,
    require_right_padding,
)
from neuron_ssp.errors import Problem, RuntimeProblem, UsageError
from neuron_ssp.speculation.acceptors import TokenAcceptor
from neuron_ssp.speculation.position_noise import PositionNoise
from neuron_ssp.topology.networks import shared_context
from neuron_ssp.topology.positions import draft_slots, require_room

Acceptor = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
NONZERO_FILLER = 1  # a finished row's padding when there is no EOS id: any id but 0 (count_nonzero counts it)


class LibraryEngine(StaticBatchEngine):
    """transformers-neuronx's loop as an engine: `row_loop()` runs one `SpeculativeGenerator.sample` call over as many
    requests at once as the models were compiled for (`target.batch_size`)."""

    engine = "library"

    def __init__(
        self,
        target: NeuronBackend,
        draft: NeuronBackend,
        acceptor: Acceptor,
        sampling: SamplingConfig,
        k: int,
        rng: torch.Generator | None = None,
        api: NeuronxApi | None = None,
        batch_size: int = 1,
    ):
        if target.speculation_length != k:
            raise UsageError(
                Problem(
                    "speculation.k",
                    k,
                    f"the target was compiled for k={target.speculation_length}",
                    "load the target with the same speculation.k",
                )
            )
        super().__init__(target, k, batch_size)
        self.draft = draft
        self.acceptor = acceptor
        self.sampling = sampling
        self.rng = rng
        self.api = api or load_neuronx()

    @classmethod
    def from_config(
        cls,
        config: Config,
        target: NeuronBackend,
        draft: NeuronBackend | None,
        acceptor: Acceptor,
        rng: torch.Generator | None = None,
    ) -> LibraryEngine:
        """Refuse the settings the library's loop cannot honour, then build the engine."""
        spec = config.speculation
        problems = []
        if config.platform.backend != "neuron":
            problems.append(
                Problem(
                    "speculation.engine",
                    spec.engine,
                    "engine 'library' is transformers-neuronx's loop and runs Neuron models only",
                    "set platform.backend: neuron, or engine: native",
                )
            )
        if not drafter_kind(spec.drafter).draft_model or draft is None:
            problems.append(
                Problem(
                    "speculation.drafter",
                    spec.drafter,
                    "engine 'library' drafts with a draft model",
                    "set speculation.drafter: model with a draft section, or engine: native",
                )
            )
        if spec.policy != "fixed":
            problems.append(
                Problem(
                    "speculation.policy",
                    spec.policy,
                    "engine 'library' always drafts k-1 tokens",
                    "use policy: fixed, or engine: native",
                )
            )
        if problems:
            raise UsageError(problems)
        api = load_neuronx()
        batch_size = config.target.batch_size  # one the installed build's loop takes: its loader checked
        if config.sampling.temperature > 0:
            tail = (
                f"; transformers-neuronx {api.version} (0.10-0.11 API) also finishes the last <= k tokens "
                "greedily (target.sample(top_k=1))"
                if api.finishes_greedily
                else ""
            )
            warnings.warn(
                "engine 'library' picks the first token after the prompt greedily (transformers-neuronx's "
                f"loop){tail}; the rest follows the sampling settings. engine native samples every token",
                stacklevel=2,
            )
        assert draft is not None
        if batch_size > 1:
            require_right_padding({"target": target.model, "draft": draft.model})
        return cls(target, draft, acceptor, config.sampling, spec.k, rng, api, batch_size)

    def row_settings(self) -> RowSettings:
        """Every request of `generate`: the config's sampling and seed, the engine's acceptor (each row draws from
        its own per-position noise; `rng` for acceptors that draw from it instead, seeded per request)."""
        acceptor = cast(TokenAcceptor, self.acceptor)  # _choose calls it, whichever convention
        return RowSettings(sampling_params(self.sampling), self.sampling.seed, acceptor=acceptor, rng=self.rng)

    def check(self, request: RowRequest) -> None:
        """The target's room, the draft's (it is refilled one slot past the target's window), and at batch > 1 one
        context network for the prompt."""
        super().check(request)
        prompt_len, new = request.prompt_ids.shape[0], request.max_new_tokens
        require_room(
            self.draft.n_positions,
            draft_slots(prompt_len, new, "library", self.k),
            prompt_len,
            new,
            "draft.n_positions",
        )
        if self.batch_size > 1:
            require_one_context(
                prompt_len,
                shared_context(
                    [(self.target.model, self.target.n_positions), (self.draft.model, self.draft.n_positions)]
                ),
                "a static batch with a longer prompt is encoded token by token past it after base.py:246-249 at "
                "1ade6d7 slices its 2-D cache_ids by row, which a batch does not survive",
            )

    def generate_rows(self, rows: list[Row], times: CallTimes) -> list[RowOutput]:
        """One `SpeculativeGenerator.sample` over `rows`, padded to the compiled batch."""
        spec = self.api.speculation
        stop_id = library_stop_id(self.target.model, common_eos(rows))
        padding = [LibraryLane.padding() for _ in range(self.batch_size - len(rows))]
        lanes = LibraryLanes(
            [LibraryLane.of(row, self.acceptor) for row in rows] + padding,
            self.k,
            self.vocab_size,
            stop_id,
            self.api.batched_acceptor,
        )
        provider = (
            row_aligned_draft(self.api, self.draft.model)
            if self.api.batched_acceptor
            else spec.DraftModelForSpeculation(self.draft.model)
        )
        loop = spec.SpeculativeGenerator(
            _Timed(provider, times, "draft_s"),
            _WatchedTarget(self.target.model, times, lanes),
            self.k,
            adapt_acceptor(self.api, lanes),
        )
        batch = padded_batch(rows, self.batch_size, pad_id(self.target.model, stop_id))
        if self.batch_size == 1:  # as before batching existed, and the only call 0.10-0.12 take
            out = loop.sample(batch.input_ids, sequence_length=batch.sequence_length, eos_token_id=stop_id)
        else:  # speculation.py:718-730: right-padded prompts, their mask, sequence ids
            out = loop.sample(
                batch.input_ids,
                sequence_length=batch.sequence_length,
                start_ids=batch.start_ids,
                eos_token_id=stop_id,
                pad_token_id=batch.pad_id,
                attention_mask=batch.attention_mask,
            )
        outputs = []
        for i, (row, lane) in enumerate(zip(rows, lanes.lanes, strict=False)):
            prompt_len = batch.prompt_lens[i]
            generated = out[i, prompt_len : prompt_len + row.seq.max_new_tokens].tolist()
            for position, real_eos in lane.rewritten.items():  # our acceptor's EOS, before it became stop_id
                if position < len(generated):
                    generated[position] = real_eos
            outputs.append(RowOutput(generated, lane.pieces, lane.error))
        return outputs


def common_eos(rows: list[Row]) -> set[int]:
    """The EOS ids every row stops at: the library stops every row at the one it is given."""
    sets = [set(row.seq.eos) for row in rows]
    return set.intersection(*sets) if sets else set()


def library_stop_id(model: Any, eos: set[int]) -> int | None:
    """The one EOS id the library's loop is given: the model config's first one when it is ours, else the smallest."""
    configured = getattr(getattr(model, "config", None), "eos_token_id", None)
    first = configured[0] if isinstance(configured, list) and configured else configured
    if isinstance(first, int) and first in eos:
        return first
    return min(eos) if eos else None


@dataclass
class LibraryLane:
    """One lane (line) of the library's batch: a row of ours (`Row`), or padding up to the compiled batch size (no
    acceptor)."""

    acceptor: Acceptor | None
    noise: PositionNoise | None
    eos: frozenset[int]
    remaining: int  # tokens the row still takes after its first one (the library picks that one itself)
    live: bool
    produced: int = 1  # output position of the next token
    last: int | None = None  # the line's last committed token: the library's next window starts with it
    pieces: list[IterationPiece] = field(default_factory=list)
    rewritten: dict[int, int] = field(default_factory=dict)  # output position -> EOS id before it became stop_id
    error: Exception | None = None

    @classmethod
    def of(cls, row: Row, default: Acceptor) -> LibraryLane:
        remaining = row.seq.max_new_tokens - 1
        return cls(row.request.settings.acceptor or default, row.noise, row.seq.eos, remaining, live=remaining > 0)

    @classmethod
    def padding(cls) -> LibraryLane:
        return cls(None, None, frozenset(), 0, live=False)

    def end(self, error: Exception | None = None) -> None:
        self.live = False
        self.error = self.error or error


class LibraryLanes:
    """Our acceptors over the library's batch: each row judged by its own acceptor and noise, every line
    committing the same number of tokens per call (the module docstring says why)."""

    def __init__(self, lanes: list[LibraryLane], k: int, vocab_size: int, stop_id: int | None, zero_padded: bool):
        self.lanes = lanes
        self.k = k
        self.vocab_size = vocab_size
        self.stop_id = stop_id
        self.zero_padded = zero_padded  # SDK 2.21+: (bs, k) zero-padded, counted with count_nonzero
        self.filler = stop_id if stop_id else NONZERO_FILLER

    def see_window(self, input_ids: torch.Tensor) -> None:
        """The target's next window starts with each row's last committed token (speculation.py:806): the
        first window tells the library's first token (:744), later ones are checked against ours."""
        for lane, token in zip(self.lanes, input_ids[:, 0].tolist(), strict=True):
            if lane.last is None:
                lane.last = token
                if token in lane.eos:
                    lane.end()
            elif lane.live and token != lane.last:
                raise RuntimeProblem(
                    Problem(
                        "speculation.engine",
                        "library",
                        f"transformers-neuronx continued a row from token {token} where it committed {lane.last}: "
                        "its batched loop does not advance rows as speculation.py at 1ade6d7 does",
                        "run target.batch_size: 1 with engine library, or use speculation.engine: native",
                    )
                )

    def __call__(
        self, draft_ids: torch.Tensor, draft_scores: torch.Tensor, target_scores: torch.Tensor
    ) -> torch.Tensor:
        target = target_scores if target_scores.dim() == 3 else target_scores.unsqueeze(0)  # SDK < 2.21: (k, V)
        ids = draft_ids.reshape(target.shape[0], -1)
        chosen = [self._choose(lane, ids[i], target[i]) if lane.live else None for i, lane in enumerate(self.lanes)]
        continuing = [len(c[0]) for lane, c in zip(self.lanes, chosen, strict=True) if c and not _ends(lane, c[0])]
        n = min(continuing) if continuing else max((len(c[0]) for c in chosen if c), default=1)
        lines = [self._take(lane, c, n) for lane, c in zip(self.lanes, chosen, strict=True)]
        if not self.zero_padded:  # SDK < 2.21: batch 1, the accepted tokens as they are
            return torch.tensor(lines, dtype=torch.int64)
        out = torch.zeros(len(lines), self.k, dtype=torch.int64)
        for i, line in enumerate(lines):
            out[i, : len(line)] = torch.tensor(line, dtype=torch.int64)
        return out

    def _choose(self, lane: LibraryLane, draft_ids: torch.Tensor, target: torch.Tensor) -> tuple[list[int], int] | None:
        """The row's tokens for this window (cut at its EOS and budget) and how many of them are drafts."""
        assert lane.acceptor is not None and lane.noise is not None
        if isinstance(lane.acceptor, TokenAcceptor):
            lane.acceptor.noise = lane.noise.shifted(lane.produced)
        drafted = point_masses(draft_ids, self.vocab_size).unsqueeze(0)  # the library drafts by argmax
        returned = torch.as_tensor(lane.acceptor(draft_ids.view(1, -1), drafted, target.unsqueeze(0))).reshape(-1)
        tokens: list[int] = returned.tolist()
        if not 1 <= len(tokens) <= len(draft_ids) + 1 or tokens[:-1] != draft_ids[: len(tokens) - 1].tolist():
            lane.end(
                RuntimeProblem(
                    Problem(
                        "speculation.acceptor",
                        type(lane.acceptor).__name__,
                        f"returned {tokens} for draft {draft_ids.tolist()}: an acceptor must return the first n-1 "
                        "drafted tokens followed by one token of its choice (1 <= n <= drafted + 1)",
                        "fix the acceptor's __call__ (the target's KV cache holds the drafted tokens)",
                    )
                )
            )
            return None
        accepted = len(tokens) - 1
        tokens = tokens[: lane.remaining]
        for i, token in enumerate(tokens):
            if token in lane.eos:
                tokens = tokens[: i + 1]
                break
        if self.zero_padded and 0 in tokens:
            lane.end(
                RuntimeProblem(
                    Problem(
                        "speculation.engine",
                        "library",
                        f"token id 0 was accepted ({tokens}); transformers-neuronx counts accepted tokens with "
                        "count_nonzero and would drop it",
                        "use speculation.engine: native (same acceptor, same compiled models)",
                    )
                )
            )
            return None
        return tokens, accepted

    def _take(self, lane: LibraryLane, chosen: tuple[list[int], int] | None, n: int) -> list[int]:
        """The line the library gets: the row's first n tokens (its EOS as stop_id), a finished row padded."""
        line: list[int] = []
        if chosen is not None:
            tokens, accepted = chosen
            kept = tokens[:n]
            lane.pieces.append(IterationPiece(kept, min(accepted, len(kept)), self.k - 1))
            lane.produced += len(kept)
            lane.remaining -= len(kept)
            lane.last = kept[-1]
            line = list(kept)
            if kept[-1] in lane.eos or lane.remaining == 0:
                lane.end()
            if kept[-1] in lane.eos and self.stop_id is not None and kept[-1] != self.stop_id:
                lane.rewritten[lane.produced - 1] = kept[-1]
                line[-1] = self.stop_id
        if lane.live:
            return line
        return line + [self.filler] * (n - len(line)) if self.zero_padded else line or [self.filler]


def _ends(lane: LibraryLane, tokens: list[int]) -> bool:
    return tokens[-1] in lane.eos or len(tokens) >= lane.remaining


def adapt_acceptor(api: NeuronxApi, lanes: LibraryLanes) -> Any:
    """`lanes` as a subclass of the installed library's `TokenAcceptor`, in either generation's shape."""

    class LibraryAcceptor(api.speculation.TokenAcceptor):  # type: ignore[name-defined,misc]
        def __call__(
            self, draft_ids: torch.Tensor, draft_scores: torch.Tensor, target_scores: torch.Tensor
        ) -> torch.Tensor:
            return lanes(draft_ids, draft_scores, target_scores)

    return LibraryAcceptor()


def row_aligned_draft(api: NeuronxApi, model: Any) -> Any:
    """The library's `DraftModelForSpeculation` (1ade6d7, speculation.py:286-365), each row's drafts at that row's
    own cache positions; call for call the library's own at batch 1 (1-D int32 cache_ids there, :356-358)."""

    class RowAlignedDraft(api.speculation.DraftModelForSpeculation):  # type: ignore[name-defined,misc]
        def __call__(
            self,
            input_ids: torch.Tensor,
            k: int,
            cache_ids: torch.Tensor | None = None,
            start_ids: torch.Tensor | None = None,
        ) -> tuple[torch.Tensor, torch.Tensor]:
            if cache_ids is None or int(cache_ids.reshape(-1)[0]) == 0:  # context encoding (:332-338)
                return super().__call__(input_ids, k, cache_ids, start_ids)
            batch = input_ids.shape[0]
            first = cache_ids.reshape(batch, -1)[:, 0]
            scores = self.model(input_ids, cache_ids, start_ids)
            tokens, rows = [], []
            for step in range(1, k + 1):
                token = torch.argmax(scores, keepdim=True, dim=1)
                tokens.append(token)
                rows.append(scores)
                if step == k:
                    break
                positions = (first + step).to(torch.int32)
                scores = self.model(token, positions.view(batch, 1) if batch > 1 else positions, start_ids)
            return torch.cat(tokens, dim=1), torch.stack(rows)

    return RowAlignedDraft(model)


class _Timed:
    """Delegates to a model or draft provider and adds the time of every call to one field of `times`."""

    def __init__(self, inner: Any, times: CallTimes, field_name: str):
        self._inner = inner
        self._times = times
        self._field = field_name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._timed(self._inner, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._inner, name)
        if not callable(attribute):
            return attribute
        return lambda *args, **kwargs: self._timed(attribute, *args, **kwargs)

    def _timed(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return func(*args, **kwargs)
        finally:
            setattr(self._times, self._field, getattr(self._times, self._field) + time.perf_counter() - start)


class _WatchedTarget(_Timed):
    """The target, timed; each speculative window's first tokens are shown to the lanes first."""

    def __init__(self, inner: Any, times: CallTimes, lanes: LibraryLanes):
        super().__init__(inner, times, "target_s")
        self._lanes = lanes

    def speculative_forward(self, *args: Any, **kwargs: Any) -> Any:
        self._lanes.see_window(kwargs["input_ids"] if "input_ids" in kwargs else args[0])
        return self._timed(self._inner.speculative_forward, *args, **kwargs)
