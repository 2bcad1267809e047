"""Losslessness: speculative sampling draws from exactly the target's distribution.

Chi-square goodness of fit against the exact distribution computed from the target, with a stated
false-alarm rate ALPHA = 1e-3 (for a correct sampler the test fails once in a thousand seeds). Seeds
are fixed, so CI is deterministic. A deliberately broken acceptor must FAIL the same test, which
shows the test has the power to catch a biased sampler.
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import TableBackend

from neuron_ssp.acceptors import ProbabilisticAcceptor, TypicalAcceptor
from neuron_ssp.config import SamplingConfig
from neuron_ssp.drafters import ModelDrafter
from neuron_ssp.generator import SpeculativeGenerator
from neuron_ssp.policies import FixedPolicy
from neuron_ssp.sampling import SamplingParams, logits_to_probs, sample

ALPHA = 1e-3
VOCAB = 12
PROMPT = torch.tensor([3, 1, 4, 1, 5])
SAMPLES = 3000


def chi_square_p_value(observed: torch.Tensor, expected_probs: torch.Tensor, n: int) -> float:
    """Pearson chi-square, cells with expected count < 5 pooled into one."""
    expected = expected_probs * n
    keep = expected >= 5
    obs = torch.cat([observed[keep], observed[~keep].sum().view(1)])
    exp = torch.cat([expected[keep], expected[~keep].sum().view(1)])
    nonzero = exp > 0
    stat = float(((obs[nonzero] - exp[nonzero]) ** 2 / exp[nonzero]).sum())
    dof = int(nonzero.sum()) - 1
    return _chi2_sf(stat, dof)


def _chi2_sf(x: float, dof: int) -> float:
    """Survival function of chi-square via the regularized upper incomplete gamma (series/continued fraction)."""
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(x / 2, dtype=torch.float64)))


def exact_two_token_distribution(target: TableBackend, params: SamplingParams) -> torch.Tensor:
    first = logits_to_probs(target.prefill(PROMPT), params)
    joint = torch.zeros(VOCAB, VOCAB, dtype=torch.float64)
    for t1 in range(VOCAB):
        second = logits_to_probs(target.score(torch.tensor([t1]), len(PROMPT))[0], params)
        joint[t1] = first[t1] * second
    return joint.flatten()


def ssp_histogram(sampling: SamplingConfig, acceptor_cls, k: int = 4) -> torch.Tensor:
    target, draft = TableBackend(VOCAB, seed=0), TableBackend(VOCAB, seed=1, sharpness=1.0)
    rng = torch.Generator()
    params = SamplingParams(sampling.temperature, sampling.top_k, sampling.top_p)
    gen = SpeculativeGenerator(target, ModelDrafter(draft, params, rng), acceptor_cls(params, rng), FixedPolicy(k),
                               sampling, k, rng)
    counts = torch.zeros(VOCAB * VOCAB, dtype=torch.float64)
    for seed in range(SAMPLES):
        gen.sampling = sampling.model_copy(update={"seed": seed})
        # k+1 new tokens so the budget never narrows the window: token 2 comes from the acceptor
        t1, t2 = gen.generate(PROMPT, k + 1).tokens[:2]
        counts[t1 * VOCAB + t2] += 1
    return counts


@pytest.mark.parametrize("sampling", [
    SamplingConfig(temperature=1.0),
    SamplingConfig(temperature=0.8, top_k=8, top_p=0.9),
], ids=["t1", "t0.8-topk8-topp0.9"])
def test_first_two_tokens_follow_the_target_distribution(sampling):
    params = SamplingParams(sampling.temperature, sampling.top_k, sampling.top_p)
    expected = exact_two_token_distribution(TableBackend(VOCAB, seed=0), params)
    observed = ssp_histogram(sampling, ProbabilisticAcceptor)
    p_value = chi_square_p_value(observed, expected, SAMPLES)
    tv = 0.5 * float((observed / SAMPLES - expected).abs().sum())
    assert p_value > ALPHA, f"SSp distribution differs from the target's (p={p_value:.2e}, TV={tv:.3f})"


def test_the_chi_square_test_catches_a_lossy_acceptor():
    """Typical acceptance is documented as lossy; the same test must reject it."""
    sampling = SamplingConfig(temperature=1.0)
    expected = exact_two_token_distribution(TableBackend(VOCAB, seed=0), SamplingParams(1.0))
    observed = ssp_histogram(sampling, TypicalAcceptor)
    assert chi_square_p_value(observed, expected, SAMPLES) < ALPHA


class NoResidualAcceptor(ProbabilisticAcceptor):
    """The classic bug: after a rejection, resample from p instead of norm(max(0, p - q))."""

    def __call__(self, draft_ids, draft_scores, target_scores):
        out = super().__call__(draft_ids, draft_scores, target_scores)
        kept = out.shape[1] - 1
        if kept < draft_ids.shape[1]:
            out[0, -1] = sample(logits_to_probs(target_scores[0, kept], self.sampling), self.generator)
        return out


def test_the_chi_square_test_catches_a_missing_residual():
    expected = exact_two_token_distribution(TableBackend(VOCAB, seed=0), SamplingParams(1.0))
    observed = ssp_histogram(SamplingConfig(temperature=1.0), NoResidualAcceptor)
    assert chi_square_p_value(observed, expected, SAMPLES) < ALPHA


def test_draft_and_target_really_differ():
    """Without a real difference between draft and target the tests above would prove nothing."""
    target, draft = TableBackend(VOCAB, seed=0), TableBackend(VOCAB, seed=1, sharpness=1.0)
    p = target.prefill(PROMPT).softmax(-1)
    q = draft.prefill(PROMPT).softmax(-1)
    assert 0.5 * float((p - q).abs().sum()) > 0.3
    assert math.isclose(float(p.sum()), 1.0, rel_tol=1e-5)
