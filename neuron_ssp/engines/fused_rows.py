"""Rows of a fused speculation graph that join and leave between its calls (continuous batching).

A fused graph drafts k-1 tokens with its draft model, scores the window on the target and accepts on the device,
in one call per step; the host feeds each running row's last committed token at its position and commits what
comes back. Two libraries' graphs run this way: NxD Inference's fused speculation (engines/nxdi_fused.py) and
transformers-neuronx's FusedSpeculativeDecoder through its `speculative_iteration` (engines/fused.py). Each
supplies what is its own: the check of a request at join, the call that encodes a prompt into a free cache line
(`first_token`), and the one call over every running row (`accepted`).
"""

from __future__ import annotations

from typing import Any

from neuron_ssp.engines.rows import Row, RowRequest, RowSlots, SlotLoop
from neuron_ssp.errors import Problem, RuntimeProblem


class FusedRowLoop(SlotLoop):
    """Rows of one fused graph, at most its compiled batch at once (`RowLoop`, engines/rows.py). One loop per loaded
    graph: it owns the cache lines. A request's drafter, acceptor and window policy are the graph's (a draft model,
    its acceptance, k fixed at compile time)."""

    library = ""  # how a failure names the library

    def __init__(self, target: Any, k: int, slots: int):
        self.target = target  # OnDeviceBackend: vocab_size, n_positions, the model
        self.k = k
        self.slots = slots
        super().__init__(RowSlots(slots))

    def join(self, request: RowRequest) -> Row:
        """Encode the prompt into a free cache line (its own call) and commit the target's first token. A
        request that ends there (EOS, a budget of one) is returned finished, not running."""
        self.check(request)
        return self.slot_rows.start(
            lambda slot: Row(request, slot, self.k, self.target.vocab_size, speculates=True), self._prefill
        )  # the graph drafts k-1 tokens every call

    def step(self) -> list[Row]:
        """One fused call for every running row; returns the rows that finished (cancelled ones included)."""
        cancelled = self.slot_rows.leave_cancelled()
        if not self.rows:
            return cancelled
        rows = sorted(self.rows, key=lambda row: row.slot)
        for row, tokens in zip(rows, self.accepted(rows), strict=True):
            try:
                if not tokens:
                    raise RuntimeProblem(
                        Problem(
                            "speculation.engine",
                            "fused",
                            f"{self.library} returned no token for cache line {row.slot}",
                            f"report it with the {self.library} version; serve with speculation.engine: native "
                            "meanwhile",
                        )
                    )
                row.stats.record_call(self.k - 1, len(tokens) - 1, row.seq.extend(tokens, len(tokens) - 1, self.k - 1))
            except Exception as exc:  # this row's failure (a callback): the others go on
                row.error = exc
        return cancelled + self.slot_rows.leave_finished()

    def check(self, request: RowRequest) -> None:
        """Refuse, before it joins, a request this graph cannot run (its room, what the library refuses)."""
        raise NotImplementedError

    def first_token(self, row: Row) -> int:
        """Encode the row's prompt into its cache line (the draft's too); the target's first token."""
        raise NotImplementedError

    def accepted(self, rows: list[Row]) -> list[list[int]]:
        """One call over `rows` (ascending cache lines), each from its last committed token at its position: the
        tokens each row committed, 1..k."""
        raise NotImplementedError

    def _prefill(self, row: Row) -> None:
        first = self.first_token(row)
        row.prefilled = row.request.prompt_ids.shape[0]
        row.seq.extend([first])
