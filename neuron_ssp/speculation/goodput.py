"""Windows for a whole batch by goodput: the drafted tokens worth scoring in one call of many rows.

A call costs t (call_cost.WidthCost.call_ms: its row count, and each segment's context: a row far into its
sequence pays more attention). Row r commits 1 token for sure (its last committed token's successor) plus, for
each drafted token j it keeps, the chance Π_{i≤j} p_{r,i} that the token and every one before it are accepted.
Goodput is the expected committed tokens of the call per millisecond: E / t (TurboSpec / SmartSpec, arXiv
2406.14066).

The best choice is found exactly by Dinkelbach's method for a ratio: for a rate λ, the choice that maximises
E - λ·t is, for every count K of drafted tokens kept, the K with the largest gain - λ·(context cost) (the gain of a
row's next token never exceeds the one before it, each p ≤ 1, and its context cost never falls below it, so the
best K always keep a prefix of each row's draft); the best K follows by trying them all. Starting from no drafts,
λ becomes the rate of each choice found until none beats it. With one row this is the cost policy's
single-request choice (`best_window`); with many rows and a cost that grows with rows (a CPU), weak drafts drop
out first, and when batching pays more than drafting no row drafts at all.
"""

from __future__ import annotations

from collections.abc import Sequence

from neuron_ssp.speculation.call_cost import WidthCost

MAX_ROUNDS = 64  # Dinkelbach's rounds; each strictly raises the rate, so a few suffice


def goodput_windows(
    chances: list[list[float]],
    cost: WidthCost,
    starts: Sequence[int] | None = None,
    others: Sequence[tuple[int, int]] = (),
) -> list[int]:
    """How many of its drafted tokens each row keeps; `chances[r][j]`: the chance that row r's drafted
    token j is accepted once tokens 0..j-1 were. `starts[r]`: the position of row r's first scored token (its
    last committed one; None: every row at the cost curve's own start). `others`: segments the call scores
    anyway, (first position, rows) each (prompt chunks being prefilled): they make drafted tokens cheaper at the
    margin."""
    rows = len(chances)
    if rows == 0:
        return []
    starts = list(starts) if starts is not None else [cost.timed_start] * rows
    # every drafted token: (its gain, the context cost it adds to its row's segment, its row), in draft order
    tokens = [
        (gain, cost.added_row_ms(start, j + 1), r)
        for r, (row, start) in enumerate(zip(chances, starts, strict=True))
        for j, gain in enumerate(_survivals(row))
    ]
    called = rows + sum(count for _, count in others)
    fixed_ms = sum(cost.segment_ms(count, start) for start, count in others)
    fixed_ms += sum(cost.segment_ms(1, start) for start in starts)
    rows_ms = [cost.rows_ms(called + kept) for kept in range(len(tokens) + 1)]  # the call's rows, by tokens kept
    best: list[tuple[float, float, int]] = []
    rate = rows / (rows_ms[0] + fixed_ms)
    for _ in range(MAX_ROUNDS):
        order = sorted(tokens, key=lambda token: token[0] - rate * token[1], reverse=True)
        top, top_value = 0, rows - rate * (rows_ms[0] + fixed_ms)
        expected, extra = float(rows), fixed_ms
        for kept, (gain, added, _) in enumerate(order, 1):
            expected += gain
            extra += added
            value = expected - rate * (rows_ms[kept] + extra)
            if value > top_value:
                top, top_value = kept, value
        if top_value <= 1e-12 * rows:  # no choice beats the current rate: the last one found is the best
            break
        best = order[:top]
        rate = (rows + sum(gain for gain, _, _ in best)) / (
            rows_ms[top] + fixed_ms + sum(added for _, added, _ in best)
        )
    kept_per_row = [0] * rows
    for _, _, r in best:
        kept_per_row[r] += 1
    return kept_per_row


def _survivals(chances: list[float]) -> list[float]:
    """Π_{i≤j} p_i for each j: the chance that drafted token j is accepted, with every one before it."""
    survivals, survive = [], 1.0
    for p in chances:
        survive *= p
        survivals.append(survive)
    return survivals


def speculate_together(chances: list[list[float]], cost: WidthCost, width: int) -> bool:
    """On compiled shapes (Neuron) a call has one width for all rows: either every row takes one token
    (the one-token network) or every row's window is padded to the compiled `width` (its drafts then cost
    nothing more). Speculate when the expected committed tokens per millisecond of the k-wide call beat
    one token per row at the one-token call's cost."""
    expected = sum(1.0 + sum(_survivals(row)) for row in chances)
    return expected / cost.at(width) > len(chances) / cost.at(1)
