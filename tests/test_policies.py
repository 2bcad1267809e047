"""k policies on models sharp enough that every branch runs: a random tiny model is unsure of every
token, so the confidence policies' drafting branches would never run on it.

The target is confident in most two-token contexts and hesitant in the rest (`flat_share`); the draft
is a noisy copy of it, so drafts are accepted often but not always. Each test asserts that the branch
it is about really ran, and that greedy output is still the target's own.
"""

from __future__ import annotations

import torch
from conftest import TableBackend

from neuron_ssp.config import SamplingConfig
from neuron_ssp.drafters import Draft, ModelDrafter
from neuron_ssp.engines.native import GenerationResult, SpeculativeGenerator, plain_generate, sampling_params
from neuron_ssp.speculation.acceptors import build_acceptor
from neuron_ssp.speculation.policies import AdaptivePolicy, FixedPolicy, TargetConfidencePolicy, WindowPolicy

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
