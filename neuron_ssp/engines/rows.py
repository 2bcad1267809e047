"""A request as a row of a loop, the interface every such loop offers, and the engine around it.

Every engine's loop (ours, continuous_batch.py; transformers-neuronx's static batches, static_batch.py; NxD
Inference's fused graph, nxdi_fused.py) takes `RowRequest`s, keeps each as a `Row` (committed tokens, cache slot,
stats, callbacks) and steps all rows at once: the server's scheduler drives it through `RowLoop`, and a single
generation is the same loop with one row (`Generator.generate`). A `RowRequest` is made in one place,
`RowSettings.request`: what the engine or the pipeline chose for the request (sampling, seed, drafter, acceptor,
window policy) and its callbacks.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Protocol

import torch

from neuron_ssp.drafters.base import Draft, Drafter
from neuron_ssp.engines.base import (
    CommitCallback,
    Committed,
    GenerationResult,
    LogitsCallback,
    StopCheck,
    TokenCallback,
)
from neuron_ssp.speculation.acceptors import TokenAcceptor
from neuron_ssp.speculation.policies import WindowPolicy
from neuron_ssp.speculation.position_noise import PositionNoise
from neuron_ssp.speculation.processors import RowProcessor
from neuron_ssp.speculation.sampling import SamplingParams
from neuron_ssp.speculation.stats import GenerationStats

DrafterForSlot = Callable[[int], Drafter]  # the row's drafter, given its cache slot (a draft model's slot)
# the row's logits processors (its grammar and sampling controls), fresh for each row, given its prompt
ProcessorFor = Callable[[torch.Tensor], RowProcessor]


@dataclass
class RowCallbacks:
    """What a request's caller hears of it (engines/base.py: tokens, their origin, the target's logits) and how it
    stops it."""

    on_tokens: TokenCallback | None = None
    on_commit: CommitCallback | None = None
    on_logits: LogitsCallback | None = None
    should_stop: StopCheck | None = None


@dataclass
class RowSettings:
    """How a request runs: its sampling and seed, and (our loop) its drafter, acceptor and window policy. `rng`: the
    generator the acceptor and drafter draw from where they do not use the per-position noise, seeded per request.
    `processor_for`: its grammar and sampling controls (speculation/processors.py), None when it has none;
    `forced_drafts`: whether the tokens its grammar forces go at the front of each proposal."""

    sampling: SamplingParams = SamplingParams()
    seed: int = 0
    drafter_for: DrafterForSlot | None = None
    acceptor: TokenAcceptor | None = None
    policy: WindowPolicy | None = None
    rng: torch.Generator | None = None
    processor_for: ProcessorFor | None = None
    forced_drafts: bool = True

    def request(
        self,
        prompt_ids: torch.Tensor,
        max_new_tokens: int,
        eos_token_ids: Collection[int] = (),
        callbacks: RowCallbacks | None = None,
    ) -> RowRequest:
        """The request a loop runs: these settings, a prompt, its budget and stop ids, the caller's callbacks."""
        if self.rng is not None:
            self.rng.manual_seed(self.seed)
        return RowRequest(prompt_ids, max_new_tokens, eos_token_ids, self, callbacks or RowCallbacks())


@dataclass(frozen=True)
class RowRequest:
    """What one request brings to the loop: its prompt, budget and stop ids, how it runs (no drafter: plain
    decoding, the baseline) and who hears of it."""

    prompt_ids: torch.Tensor
    max_new_tokens: int
    eos_token_ids: Collection[int] = ()
    settings: RowSettings = field(default_factory=RowSettings)
    callbacks: RowCallbacks = field(default_factory=RowCallbacks)


class Row:
    """A running request."""

    def __init__(self, request: RowRequest, slot: int, k: int, vocab_size: int, speculates: bool | None = None):
        """`speculates`: whether its calls draft and score windows of k (None: where it has a drafter of ours; a
        library's loop drafts for every row)."""
        self.request = request
        self.slot = slot
        settings, heard = request.settings, request.callbacks
        self.seq = Committed(
            request.prompt_ids,
            request.max_new_tokens,
            request.eos_token_ids,
            heard.on_tokens,
            heard.on_commit,
            heard.on_logits,
        )
        self.policy = settings.policy or WindowPolicy(1)
        self.drafter = settings.drafter_for(slot) if settings.drafter_for is not None else None
        self.noise = PositionNoise(settings.seed)
        self.processor = settings.processor_for(request.prompt_ids) if settings.processor_for is not None else None
        drafts = self.drafter is not None if speculates is None else speculates
        self.stats = GenerationStats(k=k if drafts else 1)
        self.started = time.perf_counter()
        self.confidence = 1.0
        self.draft = Draft.empty(vocab_size)  # this step's proposal, then what is kept of it
        self.error: Exception | None = None
        self.cancelled = False
        self.prefilled = 0  # prompt tokens in the target's cache: below the prompt's length, still prefilling

    @property
    def prefilling(self) -> bool:
        return self.prefilled < self.seq.prompt_len

    @property
    def finished(self) -> bool:
        return self.seq.done or self.cancelled or self.error is not None

    def result(self) -> GenerationResult:
        return GenerationResult(self.seq.generated(), self.stats)


def cancelled_rows(rows: list[Row]) -> list[Row]:
    """Ask each row's caller, once per step, whether it still wants the row (cancel, stop string, deadline);
    the rows that must leave now."""
    for row in rows:
        should_stop = row.request.callbacks.should_stop
        row.cancelled = bool(should_stop and should_stop())
    return [row for row in rows if row.cancelled]


class RowSlots:
    """A loop's cache slots: the rows running in them, in joining order, and the free ones. A row takes a slot to
    start and gives it back when it leaves, whatever ended it (EOS, budget, cancel, its own error); `release`, when
    given, is told each slot that comes back (a backend that pads free slots where they cost least)."""

    def __init__(self, count: int, release: Callable[[int], None] | None = None):
        self.count = count
        self.rows: list[Row] = []
        self._free = list(range(count - 1, -1, -1))
        self._release = release

    @property
    def free(self) -> int:
        return len(self._free)

    @property
    def free_slot_ids(self) -> list[int]:
        """The free slots, the next one `start` takes last."""
        return list(self._free)

    def start(self, make_row: Callable[[int], Row], begin: Callable[[Row], None], slot: int | None = None) -> Row:
        """A new row in a free slot (`slot`, or the next one), begun (its prefill, its first token): running, or left
        at once when it ended there (EOS, a budget of one). The slot comes back if `begin` fails."""
        if not self._free:
            raise RuntimeError(f"no free slot: {self.count} requests are running")
        if slot is None:
            slot = self._free[-1]
        self._free.remove(slot)
        row = make_row(slot)
        try:
            begin(row)
        except Exception:
            self._free.append(row.slot)
            raise
        if row.finished:
            self.leave(row)
        else:
            self.rows.append(row)
        return row

    def leave(self, row: Row) -> None:
        if row in self.rows:
            self.rows.remove(row)
        if row.drafter is not None:
            row.drafter.finish(row.seq.committed())
        row.stats.wall_s = time.perf_counter() - row.started
        row.stats.new_tokens = row.seq.generated_count
        self._free.append(row.slot)
        if self._release is not None:
            self._release(row.slot)

    def leave_cancelled(self) -> list[Row]:
        """Before a step: the rows whose callers no longer want them leave (cancelled_rows)."""
        cancelled = cancelled_rows(self.rows)
        for row in cancelled:
            self.leave(row)
        return cancelled

    def leave_finished(self) -> list[Row]:
        """After a step: the rows it finished leave."""
        ended = [row for row in self.rows if row.finished]
        for row in ended:
            self.leave(row)
        return ended


class SlotLoop:
    """What every loop over `RowSlots` offers beside its own join and step (`RowLoop`): its running rows in joining
    order, its free slots, and one request alone."""

    def __init__(self, slots: RowSlots):
        self.slot_rows = slots

    @property
    def rows(self) -> list[Row]:
        return self.slot_rows.rows

    @property
    def free_slots(self) -> int:
        return self.slot_rows.free

    @property
    def prefix_pool_bytes(self) -> int:
        """Host memory its prefix pool holds (continuous_batch.py's loop; 0 where it keeps none)."""
        return 0

    def join(self, request: RowRequest) -> Row:
        raise NotImplementedError

    def step(self) -> list[Row]:
        raise NotImplementedError

    def run(self, request: RowRequest) -> GenerationResult:
        return run_alone(self, request)


def run_alone(loop: RowLoop, request: RowRequest) -> GenerationResult:
    """One request alone in `loop`, stepped to its end; its own error is raised."""
    row = loop.join(request)
    while not row.finished:
        loop.step()
    if row.error is not None:
        raise row.error
    return row.result()


class RowLoop(Protocol):
    """Rows of one target at once, at most its slots. Requests join between steps; a step advances every
    running row by one call and returns the rows that finished (EOS, budget, cancel or their own error)."""

    @property
    def rows(self) -> list[Row]: ...

    @property
    def free_slots(self) -> int: ...

    @property
    def prefix_pool_bytes(self) -> int: ...

    def join(self, request: RowRequest) -> Row:
        """Start a request in a free slot; a request that ends at once (EOS, budget 1) comes back finished."""
        ...

    def step(self) -> list[Row]: ...

    def run(self, request: RowRequest) -> GenerationResult:
        """One request alone, to its end."""
        ...


class Generator:
    """An engine: its row loop and the settings of the requests it runs by itself. `generate` is one request through
    that loop (the loop with one row); the pipeline sends its own per-request settings through the same loop."""

    def row_loop(self) -> RowLoop:
        raise NotImplementedError

    def row_settings(self) -> RowSettings:
        raise NotImplementedError

    def generate(
        self,
        prompt_ids: torch.Tensor,
        max_new_tokens: int,
        eos_token_ids: Collection[int] = (),
        on_tokens: TokenCallback | None = None,
        *,
        on_commit: CommitCallback | None = None,
        should_stop: StopCheck | None = None,
        on_logits: LogitsCallback | None = None,
    ) -> GenerationResult:
        callbacks = RowCallbacks(on_tokens, on_commit, on_logits, should_stop)
        request = self.row_settings().request(prompt_ids, max_new_tokens, eos_token_ids, callbacks)
        return self.row_loop().run(request)
