"""A static batch: the rows of a library loop that generates whole requests per call.

transformers-neuronx's `SpeculativeGenerator.sample` (engine library, any batch) and
`FusedSpeculativeDecoder.sample` (engine fused at batch 1; at batch > 1 it runs rows that join and leave:
engines/fused.py) take a batch of prompts and run every one to its end in one call; nothing joins or leaves. So
rows join while no call runs, up to the batch size the models were compiled for; `step()` runs the
library ONCE over every joined row and returns all of them finished (EOS, budget, a row's own error).
Each row keeps its own prompt, budget, EOS ids, sampling seed and callbacks (`Row.seq` cuts at its EOS and
budget); the library runs to the longest budget and pads the batch to its compiled size (`StaticBatchEngine`).

A cancel (`should_stop`) is asked before a step, as in our loop (engines/continuous_batch.py): once the library call
runs it cannot be interrupted, so a cancel asked during it takes effect only after it returns, when the
row has finished anyway. Tokens reach `on_tokens` / `on_commit` after the call, one library iteration at a
time with their origin (accepted draft tokens, then the target's own).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from neuron_ssp.engines.base import check_room
from neuron_ssp.engines.rows import Generator, Row, RowLoop, RowRequest, RowSlots, SlotLoop
from neuron_ssp.errors import Problem, RuntimeProblem, UsageError
from neuron_ssp.topology.positions import extra_target_slots


@dataclass
class IterationPiece:
    """The tokens one library iteration committed for a row: `accepted` leading drafted tokens of `drafted`,
    then one token of the target's (unless the piece was cut before it)."""

    tokens: list[int]
    accepted: int
    drafted: int


@dataclass
class RowOutput:
    """What one library call produced for one row: `generated`, the library's own output after the row's
    prompt (at most its budget; authoritative), and `pieces`, what each iteration committed, in order (they
    give the tokens their origin and the statistics; tokens no piece covers count as the target's)."""

    generated: list[int]
    pieces: list[IterationPiece] = field(default_factory=list)
    error: Exception | None = None


@dataclass
class CallTimes:
    """Seconds a library call spent in each model, every row's share (one call serves the whole batch)."""

    draft_s: float = 0.0
    target_s: float = 0.0


class StaticBatchEngine(Generator):
    """An engine whose library call runs a static batch to its end (engine library; engine fused at batch 1): its
    row loop, and what a request needs before it joins. Each engine supplies the call (`generate_rows`) and adds to
    the check what its library refuses beside the target's room."""

    engine = ""  # speculation.engine: the positions rule of its loop (topology/positions.py)

    def __init__(self, target: Any, k: int, batch_size: int):
        self.target = target  # a loaded model: vocab_size, n_positions, the model
        self.k = k
        self.batch_size = batch_size  # the batch the models were compiled for: the most rows one call takes
        self.vocab_size = target.vocab_size

    def row_loop(self) -> RowLoop:
        """Requests as rows of one library call each: up to `batch_size` join, one call runs them all."""
        return StaticBatchLoop(self)

    def check(self, request: RowRequest) -> None:
        """Refuse, before it joins, a request the library cannot run (UsageError): the target's room, P+N+k-1 slots
        for both libraries' loops (topology.positions)."""
        check_room(
            self.target,
            request.prompt_ids.shape[0],
            request.max_new_tokens,
            "target.n_positions",
            extra_target_slots(self.engine, self.k),
        )

    def generate_rows(self, rows: list[Row], times: CallTimes) -> list[RowOutput]:
        """Run the library once over `rows`; one output per row, in order."""
        raise NotImplementedError


class StaticBatchLoop(SlotLoop):
    """`RowLoop` over a `StaticBatchEngine`'s call: rows join between calls, one call generates them all to their
    end."""

    def __init__(self, call: StaticBatchEngine):
        super().__init__(RowSlots(call.batch_size))
        self.call = call

    def join(self, request: RowRequest) -> Row:
        """Queue a request for the next call (nothing runs until `step`: a joined row never comes back finished)."""
        self.call.check(request)
        return self.slot_rows.start(
            lambda slot: Row(request, slot, self.call.k, self.call.vocab_size, speculates=True), _queued
        )  # the library drafts k-1 tokens every iteration, though the row has no drafter of ours

    def step(self) -> list[Row]:
        """One library call over every joined row; returns them all, ended (cancelled ones included)."""
        cancelled = self.slot_rows.leave_cancelled()
        rows = list(self.rows)
        if rows:
            self._run(rows)
        for row in rows:
            row.seq.done = True  # the library ran it to its end, whatever it left
            self.slot_rows.leave(row)
        return cancelled + rows

    def _run(self, rows: list[Row]) -> None:
        times = CallTimes()
        try:
            outputs = self.call.generate_rows(rows, times)
        except Exception as exc:  # the library call failed: every row of it did
            for row in rows:
                row.error = exc
            return
        for row, output in zip(rows, outputs, strict=True):
            row.stats.time_draft_s += times.draft_s
            row.stats.time_target_s += times.target_s
            row.error = output.error
            if row.error is None:
                try:
                    commit(row, output)
                except Exception as exc:  # this row's callback failed: the others are committed all the same
                    row.error = exc


def _queued(row: Row) -> None:
    """A row begins in the next library call, with the others that joined before it."""


def commit(row: Row, output: RowOutput) -> None:
    """Commit the library's tokens for `row` (cut at its EOS and budget), piece by piece where the pieces
    match them; record each piece in the row's statistics, including work past an EOS the library did not
    stop at (`tokens_after_eos`, as stats.py defines it). Iterations whose tokens all lie past the row's budget
    are not its calls: the other rows' (the batch runs to the longest budget), or the window both loops run from
    the last token before their cache id reaches sequence_length (speculation.py:860-862,
    fused_speculation.py:730-732)."""
    seq, stats, generated = row.seq, row.stats, output.generated
    seq.extend(generated[:1])  # the first token: the target's, from the prompt's context encoding
    budget = min(len(generated), seq.max_new_tokens)
    position = 1
    for piece in output.pieces:
        if position >= budget:
            break
        span = min(len(piece.tokens), budget - position)
        matched = _common_prefix(piece.tokens[:span], generated[position : position + span])
        if matched == 0:
            break
        committed = 0 if seq.done else seq.extend(piece.tokens[:matched], piece.accepted, piece.drafted)
        stats.record_call(piece.drafted, piece.accepted, matched)
        if seq.done:
            stats.tokens_after_eos += matched - committed
        position += matched
        if matched < span:
            break
    if not seq.done:
        seq.extend(generated[position:budget])  # no piece says where they came from (0.10's greedy tail): the target


def _common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


@dataclass
class PaddedBatch:
    """The rows' prompts as transformers-neuronx's batched loops take them (speculation.py:718-771 and
    fused_speculation.py:551-601 at 1ade6d7): padded on the RIGHT, `attention_mask` 1 on real tokens (each row's
    first new token goes at its count of ones), `start_ids` the sequence ids 0..B-1, and lines of one token up
    to the compiled batch size. `sequence_length`: the longest prompt + budget."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    start_ids: torch.Tensor
    prompt_lens: list[int]
    sequence_length: int
    pad_id: int


def padded_batch(rows: list[Row], batch_size: int, pad: int) -> PaddedBatch:
    """The batch at the longest prompt's width, even where that width is a context bucket's: the static context cache
    is sized to the bucket (decoder.py:919-936 at 1ade6d7) and a context of the bucket's width replaces it by index
    (llama/hlo.py:747-752), so a shorter row's padding lands past its own tokens whatever its cache id (0: arange x
    mask, speculation.py:728, fused_speculation.py:559)."""
    prompts = [row.request.prompt_ids.view(-1) for row in rows]
    prompts += [prompts[0][:1]] * (batch_size - len(prompts))  # padding lines: a token the models know, no budget
    width = max(len(prompt) for prompt in prompts)
    input_ids = torch.full((batch_size, width), pad, dtype=torch.int64)
    attention_mask = torch.zeros(batch_size, width, dtype=torch.int64)
    for i, prompt in enumerate(prompts):
        input_ids[i, : len(prompt)] = prompt
        attention_mask[i, : len(prompt)] = 1
    longest = max(row.seq.prompt_len + row.seq.max_new_tokens for row in rows)
    return PaddedBatch(input_ids, attention_mask, torch.arange(batch_size), [len(p) for p in prompts], longest, pad)


def require_one_context(prompt_len: int, largest: int, why: str) -> None:
    """At batch > 1 every prompt must fit one context network (`largest`: the smaller of the models' largest
    context buckets); `why`: what the library does with a longer one."""
    if prompt_len > largest:
        raise UsageError(
            Problem(
                "prompt",
                f"{prompt_len} tokens",
                f"at batch > 1 transformers-neuronx encodes a prompt in one context network of at most {largest} "
                f"tokens (its largest context bucket, half of n_positions): {why}",
                f"shorten the prompt to {largest} tokens or fewer, compile the models with a larger n_positions, or "
                "set target.batch_size: 1",
            )
        )


def pad_id(model: Any, stop: int | None) -> int:
    """The id a loop pads with: the model config's pad token, else the stop id, else 0."""
    pad = getattr(getattr(model, "config", None), "pad_token_id", None)
    return pad if isinstance(pad, int) else (stop if stop is not None else 0)


def require_right_padding(models: dict[str, Any]) -> None:
    """Batch > 1 needs models built with NeuronConfig(padding_side='right') (2-D cache_ids, each row's last
    token found by its own cache ids: base.py:443, config.py:259 at 1ade6d7); with the default 'left' every row
    would be read at the padded width (base.py:445). The fused decoder asserts it (fused_speculation.py:318-325)."""
    left = [
        role
        for role, model in models.items()
        if getattr(getattr(model, "neuron_config", None), "padding_side", "left") != "right"
    ]
    if left:
        raise RuntimeProblem(
            Problem(
                "target.batch_size",
                "> 1",
                f"the {' and '.join(left)} model was built without NeuronConfig(padding_side='right'), which "
                "transformers-neuronx's batched loops need (right-padded prompts, 2-D cache_ids)",
                "load the models through neuron-ssp with the batch in the config (it sets padding_side), or set "
                "target.batch_size: 1",
            )
        )
