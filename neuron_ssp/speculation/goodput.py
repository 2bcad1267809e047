"""Windows for a whole batch by goodput: the drafted tokens worth scoring in one call of many rows.

A call that scores n rows costs t(n) (call_cost.WidthCost, timed on the loaded target). Row r commits
1 token for sure (its last committed token's successor) plus, for each drafted token j it keeps, the
chance Π_{i≤j} p_{r,i} that the token and every one before it are accepted. Goodput is the expected
committed tokens of the call per millisecond: Σ_r E_r / t(n) (TurboSpec / SmartSpec, arXiv 2406.14066).

The marginal gain of a row's next drafted token never exceeds the one before it (each p ≤ 1), so taking
drafted tokens across rows in order of gain gives, for every total n, the most expected tokens that n rows
can hold; the best n is then the one with the highest goodput along that order. With one row this is the
cost policy's single-request choice (`best_window`); with many rows and a cost that grows with rows
(a CPU), weak drafts drop out first, and when batching pays more than drafting no row drafts at all.
"""

from __future__ import annotations

import heapq

from neuron_ssp.speculation.call_cost import WidthCost


def goodput_windows(chances: list[list[float]], cost: WidthCost, other_rows: int = 0) -> list[int]:
    """How many of its drafted tokens each row keeps; `chances[r][j]`: the chance that row r's drafted
    token j is accepted once tokens 0..j-1 were. `other_rows`: rows the call scores anyway (prompt chunks
    being prefilled), which make drafted tokens cheaper at the margin."""
    rows = len(chances)
    if rows == 0:
        return []
    heap = [(-row[0], r, 0) for r, row in enumerate(chances) if row]
    heapq.heapify(heap)
    order: list[int] = []
    n, expected = rows, float(rows)
    best_rate, best_n = expected / cost.at(n + other_rows), n
    while heap:
        negative_gain, r, j = heapq.heappop(heap)
        n += 1
        expected -= negative_gain
        order.append(r)
        rate = expected / cost.at(n + other_rows)
        if rate > best_rate:
            best_rate, best_n = rate, n
        if j + 1 < len(chances[r]):
            heapq.heappush(heap, (negative_gain * chances[r][j + 1], r, j + 1))
    kept = [0] * rows
    for r in order[: best_n - rows]:
        kept[r] += 1
    return kept


def speculate_together(chances: list[list[float]], cost: WidthCost, width: int) -> bool:
    """On compiled shapes (Neuron) a call has one width for all rows: either every row takes one token
    (the one-token network) or every row's window is padded to the compiled `width` (its drafts then cost
    nothing more). Speculate when the expected committed tokens per millisecond of the k-wide call beat
    one token per row at the one-token call's cost."""
    expected = 0.0
    for row in chances:
        expected += 1.0
        survive = 1.0
        for p in row:
            survive *= p
            expected += survive
    return expected / cost.at(width) > len(chances) / cost.at(1)
