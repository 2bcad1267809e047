"""Continuous batching with speculation: the one loop, for one request or many.

Each row is one request: its committed tokens, cache slot, drafter, acceptor, window policy, sampling
settings, seed (per-position noise) and callbacks. A step:
1. rows whose caller wants them stopped (cancel, stop string, deadline) leave;
2. each row's drafter proposes up to its window - 1 tokens;
3. the windows: rows under the cost policy are chosen together, to maximise the expected committed tokens
   per millisecond of the whole call (goodput.py); other policies keep what they keep for one request;
4. ONE target call scores every row's [last committed token] + kept drafts at its (slot, position);
5. each row accepts on its own and commits; rows that reach EOS or their budget leave, freeing the slot.
Requests join between steps (`join`: the prompt's prefill is its own call). A single `generate` is this
loop with one row, and plain decoding is a row without a drafter: every comparison runs the same code.

Rolling back a rejected draft is free: the next call writes the same positions of the row's slot. Rows
never see each other (backends.base), so on the CPU row kernel a row's logits, and hence a greedy output,
are bit for bit those of the request alone; a seeded sampled row draws from (seed, position) only
(position_noise.py), so its output does not depend on the batch, the windows or the timing either.
"""

from __future__ import annotations

import time

import torch

from neuron_ssp.backends.base import ModelBackend, Segment
from neuron_ssp.drafters.base import Draft, Drafter, LockStep, ReadsHiddenStates, SamplesDrafts
from neuron_ssp.engines.base import check_finite, check_room
from neuron_ssp.engines.rows import Row, RowRequest, RowSlots, SlotLoop
from neuron_ssp.engines.slot_caches import SlotCaches
from neuron_ssp.errors import Problem, RuntimeProblem
from neuron_ssp.speculation.acceptors import TokenAcceptor
from neuron_ssp.speculation.call_cost import WidthCost
from neuron_ssp.speculation.goodput import goodput_windows, speculate_together
from neuron_ssp.speculation.position_noise import PositionNoise, draw


class ContinuousBatchLoop(SlotLoop):
    """Rows of one target, at most `target.slots` at once, prompts prefilled first come, first served. One loop per
    target at a time: it owns the slots."""

    def __init__(self, target: ModelBackend, k: int, cost: WidthCost | None = None, caches: SlotCaches | None = None):
        """`caches`: what the slots hold, for prefix caching across this loop's requests (slot_caches.py); None:
        every prompt prefilled from position 0."""
        super().__init__(RowSlots(target.slots, getattr(target, "release_slot", None)))
        self.target = target
        self.k = k
        self.cost = cost  # the target's call cost by rows and context: goodput windows (cost policy rows)
        self.caches = caches or SlotCaches(target.slots)
        # prompt tokens scored per step beside the running rows' windows (chunked prefill: a joining prompt no
        # longer stalls every running row for a whole prefill); None: a prompt whole, in its own call at join.
        # The backend's, so every loop over a target (plain, speculative, alone, batched) cuts prompts alike
        self.prefill_chunk: int | None = getattr(target, "prompt_chunk", None)

    @property
    def prefix_pool_bytes(self) -> int:
        return self.caches.pool.bytes if self.caches.pool is not None else 0

    def join(self, request: RowRequest) -> Row:
        """Start a request: check its room, take a free slot, start its drafter and (without chunked prefill)
        prefill its prompt in its own call and commit its first token. A request that ends there (EOS, a
        budget of one) is returned finished, not running."""
        check_room(self.target, request.prompt_ids.shape[0], request.max_new_tokens, "target.n_positions")
        admission = self.caches.admit(self.slot_rows.free_slot_ids, request.prompt_ids)

        def make_row(slot: int) -> Row:
            row = Row(request, slot, self.k, self.target.vocab_size)
            row.prefilled = admission.head if _reads_hidden(row) else admission.reused
            row.stats.cached_tokens = row.prefilled
            return row

        row = self.slot_rows.start(make_row, self._begin, admission.slot)
        if row.finished:
            self._left([row])
        return row

    def step(self) -> list[Row]:
        """One target call for every running row (windows, and prompt chunks of rows still prefilling);
        returns the rows that finished (cancelled ones included)."""
        cancelled = self._left(self.slot_rows.leave_cancelled())
        if not self.rows:
            return cancelled
        chunks = self._prompt_chunks()
        decoding = [row for row in self.rows if not row.prefilling]
        self._propose(decoding, [(segment.start, len(segment.tokens)) for segment in chunks.values()])
        called = list(chunks) + decoding
        segments = list(chunks.values()) + [_window(row) for row in decoding]
        begin = time.perf_counter()
        logits, hidden = self._score(segments)
        seconds = time.perf_counter() - begin
        for row, segment, rows_logits, rows_hidden in zip(
            called,
            segments,
            logits.split([segment.returned_rows for segment in segments]),
            hidden.split([segment.hidden_rows for segment in segments]),
            strict=True,
        ):
            row.stats.time_target_s += seconds
            try:
                if row.prefilling:
                    self._prefilled(row, len(segment.tokens), rows_logits)
                    committed = len(segment.tokens)
                else:
                    committed = self._commit(row, rows_logits)
                if segment.hidden_rows:  # the taps of the tokens now committed, for the row's drafter
                    row.drafter.take_hidden(segment.start, rows_hidden[:committed])  # type: ignore[union-attr]
            except Exception as exc:  # this row's failure (non-finite logits, a callback): the others go on
                row.error = exc
            else:
                self.caches.written(row.slot, _valid_tokens(row))
        return cancelled + self._left(self.slot_rows.leave_finished())

    def _left(self, rows: list[Row]) -> list[Row]:
        """Rows that left: what their slots now hold, for the requests after them (nothing after an error)."""
        for row in rows:
            if row.error is not None:
                self.caches.lost(row.slot)
            else:
                fed = row.drafter.fed_positions if isinstance(row.drafter, ReadsHiddenStates) else 0
                self.caches.left(row.slot, _valid_tokens(row), fed)
        return rows

    def _score(self, segments: list[Segment]) -> tuple[torch.Tensor, torch.Tensor]:
        """ONE target call: the logits, and the taps of the rows the segments ask for (0 rows where none do)."""
        if any(segment.hidden_rows for segment in segments):
            return self.target.score_batch_hidden(segments)  # type: ignore[attr-defined]
        logits = self.target.score_batch(segments)
        return logits, logits.new_empty(0, 0)

    def _begin(self, row: Row) -> None:
        request = row.request
        row.policy.reset()
        begin = time.perf_counter()
        if row.drafter is not None:
            row.drafter.begin(request.prompt_ids, request.max_new_tokens, row.noise)
            if isinstance(row.drafter, ReadsHiddenStates):  # its head's cache holds the positions the prefill skips
                row.drafter.resume_at(row.prefilled)
        prefilled = time.perf_counter()
        row.stats.time_draft_s += prefilled - begin
        if self.prefill_chunk is not None:
            return  # the prompt goes in chunks beside the running rows (step)
        start, rest = row.prefilled, request.prompt_ids[row.prefilled :]
        if _reads_hidden(row):  # the prompt's taps for the row's drafter
            if start:
                logits, hidden = self._score([Segment(row.slot, start, rest, logits_rows=1, hidden_rows=len(rest))])
            else:
                logits, hidden = self.target.prefill_slot_hidden(row.slot, rest)  # type: ignore[attr-defined]
            row.drafter.take_hidden(start, hidden)  # type: ignore[union-attr]
        elif start:  # the rest of a prompt whose start the slot's cache holds (slot_caches.py)
            logits = self.target.score_batch([Segment(row.slot, start, rest, logits_rows=1)])
        else:
            logits = self.target.prefill_slot(row.slot, rest)
        row.stats.time_target_s += time.perf_counter() - prefilled
        self._prefilled(row, len(rest), logits.view(1, -1))

    def _prompt_chunks(self) -> dict[Row, Segment]:
        """This step's prompt chunks: `prefill_chunk` tokens in all, to the rows still prefilling in joining
        order. A row's chunks are scored at its own positions, so on the row kernel its logits do not depend
        on where the chunks were cut."""
        chunks: dict[Row, Segment] = {}
        budget = self.prefill_chunk or 0
        for row in self.rows:
            if budget == 0:
                break
            if row.prefilling:
                if not _reads_hidden(row):  # what the rows before it prefilled meanwhile (slot_caches.catch_up)
                    held = self.caches.catch_up(row.slot, row.request.prompt_ids, row.prefilled)
                    row.stats.cached_tokens += held - row.prefilled
                    row.prefilled = held
                end = min(row.prefilled + budget, row.seq.prompt_len)
                chunks[row] = Segment(
                    row.slot,
                    row.prefilled,
                    row.request.prompt_ids[row.prefilled : end],
                    logits_rows=int(end == row.seq.prompt_len),
                    hidden_rows=end - row.prefilled if _reads_hidden(row) else 0,
                )
                budget -= end - row.prefilled
        return chunks

    def _prefilled(self, row: Row, tokens: int, logits: torch.Tensor) -> None:
        """`tokens` more of the row's prompt are in the cache; after the last, its first token from `logits`."""
        row.prefilled += tokens
        if row.prefilling:
            return
        seq = row.seq
        check_finite(logits, seq.length - 1, self.target)
        chosen = _processed(row, logits[-1:], [])
        token = draw(chosen[0], row.request.settings.sampling, row.noise)
        _committed(row, [token], seq.extend([token], logits=logits[-1:]))
        if row.policy.uses_target_confidence:
            row.confidence = _confidence(logits[-1], seq.last)

    def _propose(self, rows: list[Row], prompts: list[tuple[int, int]]) -> None:
        """Each row's proposal, then the windows: together by goodput where every row's policy weighs so, each
        row priced at its own position (`prompts`: the prompt chunks the call scores anyway, (first position,
        tokens) each); on compiled shapes all rows speculate or none."""
        asked = {
            row: min(row.policy.window(row.confidence), self.k, row.seq.remaining) - 1
            for row in rows
            if row.drafter is not None
        }
        forced = {row: _forced(row, tokens) for row, tokens in asked.items()}
        drafting = {row: _drafting(row, asked[row], forced[row]) for row in asked}
        together = self._propose_together(drafting, forced)
        for row in rows:
            if row not in together:
                begin = time.perf_counter()
                row.draft = (
                    _drafter_of(row, forced[row]).propose(_path(row, forced[row]), drafting[row])
                    if row.drafter is not None and drafting[row] > 0
                    else Draft.empty(self.target.vocab_size)
                )
                row.stats.time_draft_s += time.perf_counter() - begin
            if row in forced:
                row.draft = _cut(row, row.draft.after(forced[row]))
        if rows and self.cost is not None and all(row.policy.by_goodput for row in rows):
            chances = [row.policy.chances(row.draft, row.confidence) for row in rows]
            width = self.target.max_score_width
            if width is not None and self.target.slots > 1:
                speculate = speculate_together(chances, self.cost, width)
                chosen = [len(row.draft) if speculate else 0 for row in rows]
            else:
                chosen = goodput_windows(chances, self.cost, [row.seq.length - 1 for row in rows], prompts)
            for row, kept in zip(rows, chosen, strict=True):
                row.draft = row.draft.prefix(row.policy.settle(row.draft, kept))
        else:
            for row in rows:
                row.draft = row.draft.prefix(row.policy.keep(row.draft, row.confidence))

    def _propose_together(self, asked: dict[Row, int], forced: dict[Row, list[int]]) -> set[Row]:
        """Rows whose drafters draft in lock-step (base.LockStep: draft models, EAGLE heads) propose together, one
        draft call per drafted position for all of them; the rows that did. A row alone drafts through its own
        propose. `asked`: the tokens each row's drafter may draft after the grammar's `forced` ones."""
        groups: dict[object, list[Row]] = {}
        for row, tokens in asked.items():
            if tokens > 0 and isinstance(row.drafter, LockStep):
                groups.setdefault(row.drafter.propose_together, []).append(row)
        together: set[Row] = set()
        for group in groups.values():
            if len(group) < 2:
                continue
            begin = time.perf_counter()
            drafts = group[0].drafter.propose_together(  # type: ignore[union-attr]
                [(_drafter_of(row, forced[row]), _path(row, forced[row]), asked[row]) for row in group]
            )
            for row, draft in zip(group, drafts, strict=True):
                row.draft = draft
                row.stats.time_draft_s += time.perf_counter() - begin
            together.update(group)
        return together

    def _commit(self, row: Row, logits: torch.Tensor) -> int:
        """Accept and commit the row's tokens; how many were committed."""
        seq, draft, settings = row.seq, row.draft, row.request.settings
        check_finite(logits, seq.length - 1, self.target)
        noise = row.noise.shifted(seq.generated_count)
        judged = _processed(row, logits, draft.tokens.tolist())  # row j as if drafts 1..j were committed
        if len(draft) and settings.acceptor is not None:
            tokens = accept(settings.acceptor, draft, judged, noise)
        else:
            tokens = [draw(judged[0], settings.sampling, noise)]
        accepted = len(tokens) - 1
        kept = seq.extend(tokens, accepted, len(draft), logits)
        _committed(row, tokens, kept)
        row.stats.record_call(len(draft), accepted, kept)
        row.policy.observe(len(draft), accepted)
        if row.policy.uses_target_confidence:
            row.confidence = _confidence(logits[accepted], tokens[-1])
        return len(tokens)


def _processed(row: Row, logits: torch.Tensor, path: list[int]) -> torch.Tensor:
    """The rows the row draws from: its logits through its processors (grammar, controls) along `path`."""
    return logits if row.processor is None else row.processor.process(logits, path)


def _committed(row: Row, tokens: list[int], kept: int) -> None:
    """The row's processors follow its committed tokens; a grammar that ended on EOS ends the row."""
    if row.processor is not None:
        row.processor.commit(tokens[:kept])
        if row.processor.finished:
            row.seq.done = True


def _forced(row: Row, asked: int) -> list[int]:
    """The tokens the row's grammar forces next, up to the `asked` drafts: the front of its proposal."""
    if row.processor is None or not row.request.settings.forced_drafts or asked <= 0:
        return []
    return row.processor.forced()[:asked]


def _drafting(row: Row, asked: int, forced: list[int]) -> int:
    """How many tokens the drafter drafts behind the forced ones: none past uncommitted tokens for a drafter that
    drafts from the target's hidden states (it has none for them)."""
    if forced and isinstance(row.drafter, ReadsHiddenStates):
        return 0
    return asked - len(forced)


def _path(row: Row, forced: list[int]) -> torch.Tensor:
    committed = row.seq.committed()
    return torch.cat([committed, torch.tensor(forced, dtype=committed.dtype)]) if forced else committed


def _drafter_of(row: Row, forced: list[int]) -> Drafter:
    """The row's drafter, told the row's processors when it samples (drafted under the mask, behind `forced`)."""
    drafter, processor = row.drafter, row.processor
    assert drafter is not None
    if isinstance(drafter, SamplesDrafts):
        drafter.mask = (
            None
            if processor is None
            else (lambda logits, drafted: processor.process(logits.view(1, -1), forced + drafted)[0])
        )
    return drafter


def _cut(row: Row, draft: Draft) -> Draft:
    """A proposal up to its first token the row's grammar refuses: exact for point masses (the target would give
    it probability 0), a no-op for a draft sampled under the mask."""
    return draft if row.processor is None else draft.prefix(row.processor.valid_prefix(draft.tokens.tolist()))


def _window(row: Row) -> Segment:
    """A decoding row's part of the call: its last committed token and its kept draft, with their taps when its
    drafter reads the target's hidden states."""
    tokens = torch.cat([torch.tensor([row.seq.last]), row.draft.tokens])
    return Segment(row.slot, row.seq.length - 1, tokens, hidden_rows=len(tokens) if _reads_hidden(row) else 0)


def _valid_tokens(row: Row) -> torch.Tensor:
    """The row's tokens whose keys and values its slot holds: the prompt prefilled so far, then every committed token
    but the last (the next call writes it)."""
    return row.seq.committed()[: row.prefilled if row.prefilling else row.seq.length - 1]


def _reads_hidden(row: Row) -> bool:
    return isinstance(row.drafter, ReadsHiddenStates)


def accept(acceptor: TokenAcceptor, draft: Draft, target_logits: torch.Tensor, noise: PositionNoise) -> list[int]:
    """The acceptor's tokens for one row, in transformers-neuronx's call shape, checked: the first n-1
    drafted tokens then one of its choice. `noise`: the positions' noise, for acceptors that draw from it."""
    acceptor.noise = noise
    out = acceptor(draft.tokens.view(1, -1), draft.logits.unsqueeze(0), target_logits.unsqueeze(0))
    tokens = out.view(-1).tolist()
    if not 1 <= len(tokens) <= len(draft) + 1 or tokens[:-1] != draft.tokens[: len(tokens) - 1].tolist():
        raise RuntimeProblem(
            Problem(
                "speculation.acceptor",
                type(acceptor).__name__,
                f"returned {tokens} for draft {draft.tokens.tolist()}: an acceptor must return the first n-1 "
                "drafted tokens followed by one token of its choice (1 <= n <= drafted + 1)",
                "fix the acceptor's __call__ (the target's KV cache holds the drafted tokens)",
            )
        )
    return tokens


def _confidence(logits: torch.Tensor, token: int) -> float:
    """The target's probability (temperature 1) for the token it just produced."""
    return float(logits.float().softmax(-1)[token])
