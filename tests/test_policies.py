"""k policies on models sharp enough that every branch runs: a random tiny model is unsure of every
token, so the confidence policies' drafting branches would never run on it.

The target is confident in most two-token contexts and hesitant in the rest (`flat_share`); the draft
is a noisy copy of it, so drafts are accepted often but not always. Each test asserts that the branch
it is about really ran, and that greedy output is still the target's own.
"""

from __future__ import annotations

import pytest
import torch
from conftest import TableBackend

from neuron_ssp.config import SamplingConfig, SpeculationConfig
from neuron_ssp.drafters import Draft, ModelDrafter
from neuron_ssp.drafters.base import point_masses
from neuron_ssp.engines.base import GenerationResult, sampling_params
from neuron_ssp.engines.native import SpeculativeGenerator, plain_generate
from neuron_ssp.speculation.acceptors import build_acceptor
from neuron_ssp.speculation.call_cost import WidthCost, affine, target_cost
from neuron_ssp.speculation.cost_policy import AcceptanceModel, best_window
from neuron_ssp.speculation.policies import (
    AdaptivePolicy,
    CostPolicy,
    FixedPolicy,
    TargetConfidencePolicy,
    WindowPolicy,
    build_policy,
)

VOCAB = 16
K = 6
NEW = 200
PROMPT = torch.tensor([1, 5, 7, 9, 5, 7, 11, 13, 5, 7])
GREEDY = SamplingConfig(temperature=0.0)


def models() -> tuple[TableBackend, TableBackend]:
    target = TableBackend(VOCAB, 0, sharpness=4.0, flat_share=0.3)
    return target, target.perturbed(1.5, seed=1)


class RecordingDrafter(ModelDrafter):
    """Remembers (asked for, proposed) of every call."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.proposals: list[tuple[int, int]] = []

    def propose(self, sequence: torch.Tensor, max_tokens: int) -> Draft:
        draft = super().propose(sequence, max_tokens)
        self.proposals.append((max_tokens, len(draft)))
        return draft


class RecordingAdaptive(AdaptivePolicy):
    def __init__(self, k: int, k_min: int):
        super().__init__(k, k_min)
        self.windows: list[int] = []

    def window(self, target_confidence: float) -> int:
        self.windows.append(super().window(target_confidence))
        return self.windows[-1]


def run(policy: WindowPolicy, stop_below: float = 0.0) -> tuple[GenerationResult, RecordingDrafter, list[int]]:
    target, draft = models()
    rng = torch.Generator()
    params = sampling_params(GREEDY)
    drafter = RecordingDrafter(draft, params, rng, stop_below)
    gen = SpeculativeGenerator(target, drafter, build_acceptor("greedy", params, rng), policy, GREEDY, K, rng)
    result = gen.generate(PROMPT, NEW)
    plain = plain_generate(models()[0], PROMPT, NEW, GREEDY).tokens
    return result, drafter, plain


def test_the_models_are_confident_in_places_and_hesitant_in_others():
    target, _ = models()
    top = target.table.softmax(-1).max(-1).values.flatten()
    assert (top > 0.8).float().mean() > 0.25 and (top < 0.2).float().mean() > 0.2


def test_adaptive_grows_after_full_acceptance_and_shrinks_after_a_rejection():
    policy = RecordingAdaptive(K, 2)
    result, _, plain = run(policy)
    assert result.tokens == plain
    steps = [b - a for a, b in zip(policy.windows, policy.windows[1:], strict=False)]
    assert result.stats.draft_tokens > 0
    assert 2 in steps, "the +2 branch (full acceptance) never ran"
    assert -1 in steps, "the -1 branch (a rejection) never ran"
    assert min(policy.windows) < K


def test_draft_confidence_stops_drafting_where_the_draft_hesitates():
    result, drafter, plain = run(FixedPolicy(K), stop_below=0.6)
    assert result.tokens == plain
    assert result.stats.draft_tokens > 0
    assert any(0 < got < asked for asked, got in drafter.proposals), "never stopped part-way"
    assert any(got == asked for asked, got in drafter.proposals), "never drafted a whole window"
    assert any(got == 0 for _, got in drafter.proposals), "never declined to draft at all"


def test_target_confidence_decodes_plainly_where_the_target_hesitates():
    result, drafter, plain = run(TargetConfidencePolicy(K, 0.6))
    stats = result.stats
    assert result.tokens == plain
    assert stats.draft_tokens > 0 and stats.num_drafts > 0
    plain_steps = stats.target_calls - stats.num_drafts
    assert plain_steps > 0, "never took a plain step"
    assert len(drafter.proposals) == stats.num_drafts  # a plain step does not even ask the drafter


def test_adaptive_stays_within_its_bounds():
    policy = AdaptivePolicy(5, 3)
    for drafted, accepted in [(4, 0), (4, 0), (4, 0), (2, 2), (4, 4), (4, 4)]:
        policy.observe(drafted, accepted)
        assert 3 <= policy.window(1.0) <= 5
    policy.observe(0, 0)  # a plain step says nothing about the draft
    assert policy.window(1.0) == 5
    policy.reset()
    assert policy.window(1.0) == 5


# ---------------------------------------------------------------- cost policy

STEEP = WidthCost({1: 10.0, 2: 17.0, 3: 20.0, 4: 23.0, 5: 26.0, 6: 29.0})  # wide calls through a slow GEMM
FLAT = WidthCost({1: 10.0, K: 10.5})  # Neuron: every window pads to the compiled k
MILD = WidthCost({1: 10.0, 2: 14.0, 3: 15.0, 4: 16.0, 5: 17.0, 6: 18.0})


def point_draft(m: int, match_len: int, deterministic: bool = True) -> Draft:
    tokens = torch.arange(m)
    return Draft(tokens, point_masses(tokens, VOCAB), match_len, deterministic)


def test_on_a_flat_curve_the_cost_policy_drafts_to_k_or_not_at_all():
    """Neuron: a narrower window costs the compiled k's call anyway, so the whole proposal or nothing."""
    for confidence in (0.05, 0.5, 0.95):
        for match_len in (0, 1, 2, 5):
            kept = CostPolicy(K, FLAT).keep(point_draft(K - 1, match_len), confidence)
            assert kept == K - 1, (confidence, match_len, kept)
    cost_of_k_twice = WidthCost({1: 10.0, K: 20.0})
    hopeless = AcceptanceModel()
    for _ in range(200):
        hopeless.record(hopeless.cells(0.05, 1, 1), 0)  # every first token judged and rejected
    assert CostPolicy(K, cost_of_k_twice, hopeless).keep(point_draft(K - 1, 1), 0.05) == 0
    assert CostPolicy(K, cost_of_k_twice).keep(point_draft(K - 1, 5), 0.95) == K - 1
    for m in range(K):
        assert best_window([0.5] * m, FLAT) in (1, m + 1)


def test_where_wide_calls_cost_more_the_cost_policy_keeps_only_what_the_evidence_backs():
    weak = CostPolicy(K, STEEP).keep(point_draft(K - 1, 1), 0.05)  # short match, hesitant target
    strong = CostPolicy(K, STEEP).keep(point_draft(K - 1, 5), 0.95)  # long match, confident target
    assert weak == 0 and strong == K - 1
    assert best_window([0.99, 0.99, 0.1, 0.1], STEEP) == 3  # two sure tokens, then noise
    assert best_window([], STEEP) == 1


def test_a_sampled_drafts_length_does_not_sway_the_cost_policy():
    """A draft model that stops early did so on its own tokens: weighing that length would make keeping a
    token depend on the token (biased). The window is chosen as if the whole proposal came, then cut."""
    only_k_pays = WidthCost({1: 10.0, **{w: 20.0 for w in range(2, K + 1)}})  # padded to k: only long drafts pay
    assert CostPolicy(K, only_k_pays).keep(point_draft(1, 0, deterministic=True), 0.95) == 0
    assert CostPolicy(K, only_k_pays).keep(point_draft(1, 0, deterministic=False), 0.95) == 1
    assert CostPolicy(K, only_k_pays).keep(point_draft(K - 1, 0, deterministic=False), 0.95) == K - 1


def test_the_acceptance_model_learns_from_what_the_target_accepts():
    model = AcceptanceModel()
    cells = model.cells(0.5, 2, 3)
    before = [model.chance(cell) for cell in cells]
    for _ in range(50):
        model.record(cells, 3)  # every drafted token accepted
    assert all(model.chance(cell) > b for cell, b in zip(cells, before, strict=True))
    model.record(cells, 0)  # first rejected: only the first token was judged
    assert model.judged[cells[0]] == 51 and model.judged[cells[1]] == 50


def test_the_cost_policy_keeps_greedy_output_and_trims_drafts():
    class Recording(CostPolicy):
        kept: list[tuple[int, int]] = []

        def keep(self, draft: Draft, target_confidence: float) -> int:
            self.kept.append((len(draft), super().keep(draft, target_confidence)))
            return self.kept[-1][1]

    policy = Recording(K, MILD)
    result, _, plain = run(policy)
    assert result.tokens == plain
    assert any(kept < offered for offered, kept in policy.kept), "never trimmed a proposal"
    assert any(kept == offered > 0 for offered, kept in policy.kept), "never kept a whole proposal"
    assert result.stats.num_drafts == sum(kept > 0 for _, kept in policy.kept)


class PaddedTable(TableBackend):
    """A Neuron-like target: one compiled window k, narrower windows padded to it."""

    def __init__(self, k: int):
        super().__init__(VOCAB, 0)
        self.max_score_width = k
        self.scored_widths: list[int] = []

    def with_window(self, width: int) -> PaddedTable:
        return self

    def score(self, token_ids: torch.Tensor, start: int) -> torch.Tensor:
        self.scored_widths.append(len(token_ids))
        return super().score(token_ids, start)


def test_the_target_is_timed_per_width_a_batch_per_row_count_and_a_padded_target_at_1_and_k_only():
    any_width = TableBackend(VOCAB, 0)
    assert sorted(target_cost(any_width, 9).ms) == list(range(1, 10))  # the widths not timed lie on the line
    assert {n for start, n in any_width.calls if start > 0} == {1, 2, 4, 8, 9}  # the widths timed
    batch = TableBackend(VOCAB, 0)
    cost = target_cost(batch, 9, max_rows=40)
    assert {n for start, n in batch.calls if start > 0} == {1, 2, 4, 8, 9, 16, 32, 40}
    assert sorted(cost.ms)[-3:] == [16, 32, 40] and cost.at(20) == pytest.approx(
        cost.at(16) + (cost.at(32) - cost.at(16)) / 4
    )  # row counts between the timed ones: on the line
    padded = PaddedTable(K)
    cost = target_cost(padded, K, max_rows=4 * K)
    assert set(padded.scored_widths) == {1, K} and cost.at(2) == cost.at(K)  # flat from 2 to the compiled k
    policy = build_policy(SpeculationConfig(k=K, policy="cost"), cost)
    assert isinstance(policy, CostPolicy) and policy.chooser.cost is cost


def test_the_curve_is_smoothed_to_a_line_from_width_3_on_and_widths_1_and_2_stay_measured():
    """One and two rows run other CPU kernels than wider calls: a cheap width 2 must not bend the line."""
    noisy = WidthCost({1: 10.0, 2: 10.5, 4: 12.0, 8: 17.0, 12: 18.0})  # width 8 timed during a busy spell
    line = affine(noisy, 12)
    assert line.at(1) == 10.0 and line.at(2) == 10.5 and sorted(line.ms) == list(range(1, 13))
    assert line.at(3) < line.at(8) < line.at(12) and line.at(8) != 17.0
    steps = [line.at(w + 1) - line.at(w) for w in range(3, 12)]
    assert max(steps) - min(steps) < 1e-9  # one slope
    assert affine(WidthCost({1: 10.0, 2: 9.0, 4: 15.0, 8: 12.0}), 8).at(5) == 13.5  # negative slope: flat at the mean
