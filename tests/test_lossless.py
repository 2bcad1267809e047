"""Losslessness: speculative sampling draws from exactly the target's distribution, at every position
of a block, the bonus token included: a bug that only touches the bonus token (drawn from the wrong row)
is invisible to a test of the first drafted token.

The target is a table LM (logits from the last two tokens), so the exact distribution of every new
token is computable: propagate the distribution over (previous, current) token pairs. With k = 4 the
first block drafts tokens 2-4 and its bonus is token 5, so the test judges, from SAMPLES generations
of 5 tokens each: the marginal of each token 1..5, and the joint of each neighbouring pair (1,2) ..
(4,5). Nine chi-square tests (scipy.stats.chisquare) at ALPHA / 9 each: for a correct sampler the
whole test fails at most once in a thousand seeds (Bonferroni). Seeds are fixed, so CI is
deterministic. Deliberately broken acceptors (lossy, no residual, a wrong bonus row) must FAIL it,
which shows the power to catch each bug; the bonus bug is invisible to a test of the first two tokens.
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import TableBackend
from lossless_support import block_p_values

from neuron_ssp.config import SamplingConfig
from neuron_ssp.drafters import Draft, ModelDrafter
from neuron_ssp.engines.native import SpeculativeGenerator
from neuron_ssp.speculation.acceptors import ProbabilisticAcceptor, TypicalAcceptor
from neuron_ssp.speculation.call_cost import WidthCost
from neuron_ssp.speculation.policies import CostPolicy, FixedPolicy, WindowPolicy
from neuron_ssp.speculation.position_noise import draw
from neuron_ssp.speculation.sampling import SamplingParams, logits_to_probs, sample

ALPHA = 1e-3
VOCAB = 12
K = 4
NEW = K + 1  # the first block's tokens 2..k and its bonus token k+1
PROMPT = torch.tensor([3, 1, 4, 1, 5])
SAMPLES = 3000
TESTS = NEW + (NEW - 1)  # marginals and neighbouring pairs


def models(noise: float = 0.8) -> tuple[TableBackend, TableBackend]:
    """A target and a draft that differ (see the last test) yet agree often enough to reach the bonus."""
    target = TableBackend(VOCAB, seed=0)
    return target, target.perturbed(noise, seed=1)


def exact_pair_distributions(target: TableBackend, params: SamplingParams) -> list[torch.Tensor]:
    """P(token j-1, token j) for j = 1..NEW as (V, V) tensors (token 0 is the prompt's last)."""
    next_probs = logits_to_probs(target.table, params).double()  # (prev, cur) -> next
    state = torch.zeros(VOCAB, VOCAB, dtype=torch.float64)
    state[PROMPT[-2], PROMPT[-1]] = 1.0
    pairs = []
    for _ in range(NEW):
        state = torch.einsum("ab,abt->bt", state, next_probs)
        pairs.append(state)
    return pairs


def ssp_samples(
    sampling: SamplingConfig, acceptor_cls, policy: WindowPolicy | None = None, noise: float = 0.8
) -> tuple[torch.Tensor, int]:
    """SAMPLES generations of NEW tokens (one row each), and how many used the first block's bonus."""
    target, draft = models(noise)
    rng = torch.Generator()
    params = SamplingParams(sampling.temperature, sampling.top_k, sampling.top_p)
    gen = SpeculativeGenerator(
        target, ModelDrafter(draft, params, rng), acceptor_cls(params, rng), policy or FixedPolicy(K), sampling, K, rng
    )
    rows, bonus = [], 0
    for seed in range(SAMPLES):
        gen.sampling = sampling.model_copy(update={"seed": seed})
        result = gen.generate(PROMPT, NEW)
        rows.append(result.tokens)
        bonus += result.stats.target_calls == 1  # one call committed tokens 2..5: all drafts kept + bonus
    return torch.tensor(rows), bonus


def p_values(
    sampling: SamplingConfig, acceptor_cls, policy: WindowPolicy | None = None, noise: float = 0.8
) -> tuple[dict[str, float], int]:
    """The p-value of every marginal and neighbouring-pair test, by name."""
    params = SamplingParams(sampling.temperature, sampling.top_k, sampling.top_p)
    exact = exact_pair_distributions(models()[0], params)
    tokens, bonus = ssp_samples(sampling, acceptor_cls, policy, noise)
    found = block_p_values(tokens, exact, VOCAB)
    assert len(found) == TESTS
    return found, bonus


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingConfig(temperature=1.0),
        SamplingConfig(temperature=0.8, top_k=8, top_p=0.9),
    ],
    ids=["t1", "t0.8-topk8-topp0.9"],
)
def test_every_position_of_a_block_follows_the_target_distribution(sampling):
    found, bonus = p_values(sampling, ProbabilisticAcceptor)
    assert bonus > SAMPLES / 20, f"the bonus position was reached only {bonus} times"
    failing = {name: p for name, p in found.items() if p <= ALPHA / TESTS}
    assert not failing, f"SSp differs from the target at {failing}"


class CountingCostPolicy(CostPolicy):
    """Counts the proposals it cut short, so the test knows the trimming branch ran."""

    trimmed = 0

    def keep(self, draft: Draft, target_confidence: float) -> int:
        kept = super().keep(draft, target_confidence)
        self.trimmed += kept < len(draft)
        return kept


def test_the_cost_policy_stays_lossless():
    """It trims drafts on evidence known before they are drawn (the target's confidence, the position, what
    it learnt from earlier calls), never on the drafted tokens, so accepted tokens keep p's distribution."""
    policy = CountingCostPolicy(K, WidthCost({1: 1.0, 2: 1.5, 3: 1.7, 4: 2.2}))
    found, _ = p_values(SamplingConfig(temperature=1.0), ProbabilisticAcceptor, policy)
    assert policy.trimmed > SAMPLES / 10, f"the policy cut only {policy.trimmed} proposals short"
    failing = {name: p for name, p in found.items() if p <= ALPHA / TESTS}
    assert not failing, f"SSp with the cost policy differs from the target at {failing}"


class PeekingPolicy(FixedPolicy):
    """The bug the cost policy must not have: deciding on the drafted tokens themselves."""

    def keep(self, draft: Draft, target_confidence: float) -> int:
        return 0 if len(draft) and int(draft.tokens[0]) % 2 else len(draft)


class OwnRandomnessAcceptor(ProbabilisticAcceptor):
    """Rejection sampling with its own generator, ignoring the loop's per-position noise: what a plug-in
    acceptor that draws its own numbers does."""

    @property
    def noise(self) -> None:
        return None

    @noise.setter
    def noise(self, _: object) -> None:
        """The loop's noise is not used."""


def test_with_per_position_noise_even_a_peeking_policy_stays_lossless():
    """The committed tokens are plain sampling's whatever the windows: no window choice can bias them, not even
    one made on the drafted tokens (with a shared random stream this policy was lossy, and caught here)."""
    found, _ = p_values(SamplingConfig(temperature=1.0), ProbabilisticAcceptor, PeekingPolicy(K))
    failing = {name: p for name, p in found.items() if p <= ALPHA / TESTS}
    assert not failing, failing


def test_rejection_sampling_with_its_own_randomness_stays_lossless():
    found, bonus = p_values(SamplingConfig(temperature=1.0), OwnRandomnessAcceptor)
    assert bonus > SAMPLES / 20
    failing = {name: p for name, p in found.items() if p <= ALPHA / TESTS}
    assert not failing, failing


def test_the_test_catches_a_lossy_acceptor():
    """Typical acceptance is documented as lossy; the same test must reject it."""
    found, _ = p_values(SamplingConfig(temperature=1.0), TypicalAcceptor)
    assert min(found.values()) <= ALPHA / TESTS


class NoResidualAcceptor(ProbabilisticAcceptor):
    """The classic bug: after a rejection, resample from p instead of norm(max(0, p - q))."""

    def __call__(self, draft_ids, draft_scores, target_scores):
        out = super().__call__(draft_ids, draft_scores, target_scores)
        kept = out.shape[1] - 1
        if kept < draft_ids.shape[1]:
            out[0, -1] = sample(logits_to_probs(target_scores[0, kept], self.sampling), self.generator)
        return out


class WrongBonusRowAcceptor(ProbabilisticAcceptor):
    """A bonus-only bug: when every draft is kept, draw the bonus from the last DRAFT position's row."""

    def __call__(self, draft_ids, draft_scores, target_scores):
        out = super().__call__(draft_ids, draft_scores, target_scores)
        m = draft_ids.shape[1]
        if out.shape[1] == m + 1:
            out[0, -1] = sample(logits_to_probs(target_scores[0, m - 1], self.sampling), self.generator)
        return out


class FreshNoiseAcceptor(ProbabilisticAcceptor):
    """A broken coupling: on a mismatch it commits a token drawn with other noise (the next position's)
    instead of the one it compared the draft with, so the drafted token comes out too often."""

    def __call__(self, draft_ids, draft_scores, target_scores):
        out = super().__call__(draft_ids, draft_scores, target_scores)
        kept = out.shape[1] - 1
        if kept < draft_ids.shape[1]:
            out[0, -1] = draw(target_scores[0, kept], self.sampling, self.noise, kept + 1)
        return out


@pytest.mark.parametrize(
    "broken",
    [NoResidualAcceptor, WrongBonusRowAcceptor, FreshNoiseAcceptor],
    ids=["no-residual", "bonus-row", "broken-coupling"],
)
def test_the_test_catches_a_broken_acceptor(broken):
    found, _ = p_values(SamplingConfig(temperature=1.0), broken)
    assert min(found.values()) <= ALPHA / TESTS, found


def test_draft_and_target_really_differ():
    """Without a real difference between draft and target the tests above would prove nothing."""
    target, draft = models()
    p = target.prefill(PROMPT).softmax(-1)
    q = draft.prefill(PROMPT).softmax(-1)
    assert 0.5 * float((p - q).abs().sum()) > 0.2
    assert math.isclose(float(p.sum()), 1.0, rel_tol=1e-5)


def test_the_exact_distributions_are_distributions():
    for pair in exact_pair_distributions(models()[0], SamplingParams(1.0)):
        assert float(pair.sum()) == pytest.approx(1.0)
