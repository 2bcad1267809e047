"""Continuous batching: rows join and leave between steps, and each row's output is its request's alone.

The target and the draft are table LMs held per slot (exact arithmetic, so any difference is the loop's):
greedy rows equal plain greedy decoding, seeded sampled rows equal plain sampling with the same seed,
whatever else is in the batch, the windows, the policy, cancels, EOS inside an accepted window and
budget cuts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
import torch
from conftest import TableBackend

from neuron_ssp.backends.base import Segment, SlotView
from neuron_ssp.config import SamplingConfig
from neuron_ssp.drafters import ModelDrafter, NgramDrafter
from neuron_ssp.engines.base import sampling_params
from neuron_ssp.engines.continuous_batch import ContinuousBatchLoop
from neuron_ssp.engines.native import plain_generate
from neuron_ssp.engines.rows import RowCallbacks, RowRequest, RowSettings
from neuron_ssp.speculation.acceptors import ProbabilisticAcceptor
from neuron_ssp.speculation.call_cost import WidthCost
from neuron_ssp.speculation.cost_policy import AcceptanceModel
from neuron_ssp.speculation.policies import CostPolicy, FixedPolicy, WindowPolicy

VOCAB, EOS, K, SLOTS = 16, 3, 4, 3
CHEAP_ROWS = WidthCost({1: 10.0, 2: 10.5, 4: 11.0, 8: 12.0, 16: 16.0})


class SlotTables:
    """`slots` sequences of one table LM: a batched backend whose arithmetic cannot depend on the batch."""

    max_score_width = None

    def __init__(self, make: Callable[[], TableBackend], slots: int):
        self.per_slot = [make() for _ in range(slots)]
        first = self.per_slot[0]
        self.name, self.vocab_size, self.n_positions = first.name, first.vocab_size, first.n_positions
        self.slots = slots
        self.calls: list[list[tuple[int, int, int]]] = []  # per call: (slot, start, tokens) of each segment

    def prefill(self, prompt_ids: torch.Tensor) -> torch.Tensor:
        return self.prefill_slot(0, prompt_ids)

    def score(self, token_ids: torch.Tensor, start: int) -> torch.Tensor:
        return self.score_batch([Segment(0, start, token_ids)])

    def prefill_slot(self, slot: int, prompt_ids: torch.Tensor) -> torch.Tensor:
        return self.per_slot[slot].prefill(prompt_ids)

    def score_batch(self, segments: Sequence[Segment]) -> torch.Tensor:
        assert len({s.slot for s in segments}) == len(segments), "a slot twice in one call"
        self.calls.append([(s.slot, s.start, len(s.tokens)) for s in segments])
        return torch.cat([self.per_slot[s.slot].score(s.tokens, s.start) for s in segments])


def draft_table() -> TableBackend:
    return TableBackend(VOCAB, 0).perturbed(0.5, seed=1)


PROMPTS = [
    torch.tensor(p)
    for p in ([1, 5, 7, 9, 5], [2, 4, 6], [7, 7, 1, 2, 9, 4, 4], [5], [8, 6, 2, 1], [9, 9, 9, 9, 9, 9], [4, 1])
]
BUDGETS = [12, 30, 7, 25, 1, 18, 22]


def request(
    i: int, sampling: SamplingConfig, draft: SlotTables | None, policy: WindowPolicy, stop_after: int | None = None
) -> RowRequest:
    params = sampling_params(sampling)
    rng = torch.Generator().manual_seed(sampling.seed)

    def drafter_for(slot: int):
        return ModelDrafter(SlotView(draft, slot), params, rng) if draft is not None else NgramDrafter(VOCAB)

    calls = [0]

    def should_stop() -> bool:
        calls[0] += 1
        return stop_after is not None and calls[0] > stop_after

    settings = RowSettings(params, sampling.seed, drafter_for, ProbabilisticAcceptor(params, rng), policy)
    return RowRequest(PROMPTS[i], BUDGETS[i], {EOS}, settings, RowCallbacks(should_stop=should_stop))


def run_batched(loop: ContinuousBatchLoop, requests: list[RowRequest]) -> dict[int, list[int]]:
    """Requests join as slots free up (in order), the loop steps until every one has ended."""
    pending, running, done = list(enumerate(requests)), {}, {}
    while pending or loop.rows:
        while pending and loop.free_slots:
            i, req = pending.pop(0)
            row = loop.join(req)
            if row.finished:
                done[i] = row.result().tokens
            else:
                running[row] = i
        for row in loop.step():
            assert row.error is None, row.error
            done[running.pop(row)] = row.result().tokens
    assert loop.free_slots == loop.target.slots  # every slot came back, once
    return done


def alone(i: int, sampling: SamplingConfig) -> list[int]:
    return plain_generate(TableBackend(VOCAB, 0), PROMPTS[i], BUDGETS[i], sampling, {EOS}).tokens


SAMPLINGS = [
    SamplingConfig(temperature=0.0),
    SamplingConfig(temperature=1.0, seed=11),
    SamplingConfig(temperature=0.7, top_k=5, seed=12),
    SamplingConfig(temperature=1.3, top_p=0.8, seed=13),
    SamplingConfig(temperature=0.0, seed=4),
    SamplingConfig(temperature=0.9, seed=2**63 - 5),
    SamplingConfig(temperature=1.0, top_k=3, top_p=0.9, seed=7),
]


@pytest.mark.parametrize("drafter", ["model", "ngram"])
@pytest.mark.parametrize("policy", ["fixed", "cost"])
def test_every_row_equals_its_request_alone_with_rows_joining_and_leaving(drafter, policy):
    target = SlotTables(lambda: TableBackend(VOCAB, 0), SLOTS)
    draft = SlotTables(draft_table, SLOTS) if drafter == "model" else None
    counts = AcceptanceModel()

    def policy_for() -> WindowPolicy:
        return FixedPolicy(K) if policy == "fixed" else CostPolicy(K, CHEAP_ROWS, counts)

    loop = ContinuousBatchLoop(target, K, CHEAP_ROWS if policy == "cost" else None)
    outputs = run_batched(loop, [request(i, s, draft, policy_for()) for i, s in enumerate(SAMPLINGS)])
    for i, sampling in enumerate(SAMPLINGS):
        assert outputs[i] == alone(i, sampling), f"row {i} ({sampling})"
    assert max(len(call) for call in target.calls) == SLOTS  # rows really shared calls
    assert any(out[-1] == EOS and len(out) < BUDGETS[i] for i, out in outputs.items())  # an EOS cut a row
    assert any(len(out) == BUDGETS[i] for i, out in outputs.items())  # and a budget another
    if drafter == "model":
        assert any(n > 1 for call in target.calls for _, _, n in call)  # drafts were scored


def test_a_cancelled_row_leaves_and_the_others_are_unchanged():
    target = SlotTables(lambda: TableBackend(VOCAB, 0), SLOTS)
    draft = SlotTables(draft_table, SLOTS)
    requests = [request(i, s, draft, FixedPolicy(K), stop_after=3 if i == 1 else None) for i, s in enumerate(SAMPLINGS)]
    outputs = run_batched(ContinuousBatchLoop(target, K), requests)
    for i, sampling in enumerate(SAMPLINGS):
        expected = alone(i, sampling)
        if i == 1:
            assert 0 < len(outputs[i]) < len(expected) and outputs[i] == expected[: len(outputs[i])]
        else:
            assert outputs[i] == expected


def test_the_windows_do_not_change_a_seeded_sampled_output():
    """Fixed windows, cost-policy windows (cheap or dear rows, any counts), plain steps: the same tokens."""
    sampling = SamplingConfig(temperature=1.0, seed=99)
    expected = alone(1, sampling)
    dear = WidthCost({1: 10.0, 2: 30.0, 16: 200.0})
    for cost, policy in (
        (None, FixedPolicy(K)),
        (CHEAP_ROWS, CostPolicy(K, CHEAP_ROWS)),
        (dear, CostPolicy(K, dear)),
        (None, FixedPolicy(1)),
    ):
        target = SlotTables(lambda: TableBackend(VOCAB, 0), 1)
        tokens = (
            ContinuousBatchLoop(target, K, cost).run(request(1, sampling, SlotTables(draft_table, 1), policy)).tokens
        )
        assert tokens == expected


def test_when_rows_are_dear_the_batch_drafts_less():
    dear = WidthCost({1: 10.0, 2: 20.0, 16: 160.0})  # every row costs as much as the first: drafting never pays

    def drafted(cost: WidthCost) -> int:
        target, draft = SlotTables(lambda: TableBackend(VOCAB, 0), SLOTS), SlotTables(draft_table, SLOTS)
        counts = AcceptanceModel()
        requests = [request(i, SamplingConfig(), draft, CostPolicy(K, cost, counts)) for i in range(SLOTS)]
        run_batched(ContinuousBatchLoop(target, K, cost), requests)
        return sum(n - 1 for call in target.calls for _, _, n in call)

    assert drafted(dear) == 0 < drafted(CHEAP_ROWS)


def test_a_join_that_fails_frees_its_slot():
    target = SlotTables(lambda: TableBackend(VOCAB, 0, n_positions=16), 1)
    loop = ContinuousBatchLoop(target, K)
    too_long = RowRequest(torch.arange(15) % VOCAB, 8)
    with pytest.raises(Exception, match="n_positions"):
        loop.join(too_long)
    assert loop.free_slots == 1


class CompiledTables(SlotTables):
    """SlotTables with compiled shapes (Neuron): a call is one-token or k wide for all its rows."""

    max_score_width = K


@pytest.mark.parametrize("k_wide_ms", [12.0, 60.0])
def test_on_compiled_shapes_every_row_speculates_or_none_and_outputs_stay_the_requests_alone(k_wide_ms):
    cost = WidthCost({1: 10.0, K: k_wide_ms})  # the one-token network, the k-wide one: cheap, then dear
    target, draft = CompiledTables(lambda: TableBackend(VOCAB, 0), SLOTS), SlotTables(draft_table, SLOTS)
    counts = AcceptanceModel()
    requests = [request(i, s, draft, CostPolicy(K, cost, counts)) for i, s in enumerate(SAMPLINGS)]
    outputs = run_batched(ContinuousBatchLoop(target, K, cost), requests)
    for i, sampling in enumerate(SAMPLINGS):
        assert outputs[i] == alone(i, sampling), f"row {i}"
    widths = [[n for _, _, n in call] for call in target.calls]
    speculating = [call for call in widths if max(call) > 1]
    if k_wide_ms == 60.0:
        assert not speculating  # 6x a one-token call: no batch of these drafts yields more per millisecond
    else:
        assert len(speculating) > len(widths) // 2  # cheap: most steps speculate...
        # ...every row its whole draft (a draft model's k-1 tokens), since padding to k costs nothing more
        assert any(call.count(K) >= 2 for call in speculating)


def test_rows_on_one_batched_draft_model_draft_in_lock_step():
    """k-1 draft calls a step for all rows together (each scoring every row still drafting), not one call per
    row per drafted token: on compiled shapes each draft call costs the whole batch anyway."""
    target, draft = SlotTables(lambda: TableBackend(VOCAB, 0), SLOTS), SlotTables(draft_table, SLOTS)
    loop = ContinuousBatchLoop(target, K)
    rows = [loop.join(request(i, SamplingConfig(), draft, FixedPolicy(K))) for i in (0, 1, 2)]
    before = len(draft.calls)
    loop.step()
    step_calls = draft.calls[before:]
    assert len(step_calls) == K - 1  # the catch-up call, then one call per further drafted position
    assert all(sorted(slot for slot, _, _ in call) == sorted(row.slot for row in rows) for call in step_calls)
