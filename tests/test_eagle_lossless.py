"""Losslessness of the EAGLE-3 drafter (issue 42 item 5): speculative sampling with a tiny random head over a
tiny random Llama target draws every token of a block, the bonus token included, from the target's distribution.

As tests/test_lossless.py, with k = 3 (a random head agrees with the target too rarely to reach a k = 4 bonus often):
the first block drafts tokens 2-3 and its bonus is token 4; the marginal of each token 1..4 and the joint of each
neighbouring pair, seven chi-square tests at ALPHA / 7 each, against the target's exact distributions (every
prefix of up to 3 generated tokens enumerated: 12^3 sequences in one forward). Our loop's coupled acceptance is
checked exactly (a seeded sample equals plain sampling) in tests/test_eagle_drafter.py. The
head's draft vocabulary is 8 of the target's 12 tokens, so 4 tokens have draft probability 0. Rejection sampling
with its own random numbers reads the draft distribution the drafter reports (our loop's coupled acceptance does
not), so a drafter whose reported distribution is mapped onto the target vocabulary through a broken d2t (here
read one draft id off) while its tokens are mapped right must fail the same test.
"""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_llama
from eagle_support import tiny_head
from lossless_support import block_p_values
from test_lossless import OwnRandomnessAcceptor

from neuron_ssp.backends.torch.scoring import TorchBackend
from neuron_ssp.drafters import eagle as eagle_module
from neuron_ssp.drafters.eagle import EagleDrafter, EagleModel
from neuron_ssp.engines.continuous_batch import ContinuousBatchLoop
from neuron_ssp.engines.rows import RowRequest, RowSettings
from neuron_ssp.speculation.policies import FixedPolicy
from neuron_ssp.speculation.sampling import SamplingParams, logits_to_probs

ALPHA = 1e-3
VOCAB, DRAFT_VOCAB, K = 12, 8, 3
NEW = K + 1
PROMPT = torch.tensor([3, 1, 4, 1, 5])
SAMPLES = 2000
SLOTS = 64
TESTS = NEW + (NEW - 1)


def llama():
    """A target confident enough that the tests have power, hesitant enough that drafts are kept."""
    model = tiny_llama(6, vocab_size=VOCAB, layers=4)
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)
    return model


def exact_pair_distributions(model, params: SamplingParams) -> list[torch.Tensor]:
    """P(token j-1, token j) for j = 1..NEW as (V, V) (token 0 is the prompt's last): every prefix enumerated."""
    prefixes, weights = torch.empty(1, 0, dtype=torch.long), torch.ones(1, dtype=torch.float64)
    pairs = []
    for _ in range(NEW):
        inputs = torch.cat([PROMPT.expand(prefixes.shape[0], -1), prefixes], 1)
        with torch.no_grad():
            probs = logits_to_probs(model(input_ids=inputs).logits[:, -1], params).double()
        joint = weights[:, None] * probs  # (prefixes, V)
        previous = inputs[:, -1]
        pairs.append(torch.zeros(VOCAB, VOCAB, dtype=torch.float64).index_add_(0, previous, joint))
        prefixes = torch.cat(
            [prefixes.repeat_interleave(VOCAB, 0), torch.arange(VOCAB).repeat(prefixes.shape[0])[:, None]], 1
        )
        weights = joint.flatten()
    return pairs


def samples(params: SamplingParams) -> tuple[torch.Tensor, int]:
    """SAMPLES generations of NEW tokens (rows of one batch loop), and how many reached the first block's bonus."""
    model = llama()
    target = TorchBackend(model, 64, slots=SLOTS, prompt_chunk=SLOTS * len(PROMPT))
    head = EagleModel(tiny_head(VOCAB, DRAFT_VOCAB, (1, 3, 2), seed=4, scale=0.3), target)
    generator = torch.Generator().manual_seed(0)
    tokens, bonus = [], 0
    for first in range(0, SAMPLES, SLOTS):
        loop = ContinuousBatchLoop(target, K)
        rows = [
            loop.join(
                RowRequest(
                    PROMPT,
                    NEW,
                    settings=RowSettings(
                        params,
                        seed,
                        drafter_for=lambda slot: EagleDrafter(head, slot, params),
                        acceptor=OwnRandomnessAcceptor(params, generator),
                        policy=FixedPolicy(K),
                    ),
                )
            )
            for seed in range(first, min(first + SLOTS, SAMPLES))
        ]
        while loop.rows:
            loop.step()
        tokens += [row.seq.generated() for row in rows]
        bonus += sum(row.stats.target_calls == 1 for row in rows)  # tokens 2..4 in one call: all kept + bonus
    return torch.tensor(tokens), bonus


def p_values(params: SamplingParams) -> tuple[dict[str, float], int]:
    exact = exact_pair_distributions(llama(), params)
    tokens, bonus = samples(params)
    found = block_p_values(tokens, exact, VOCAB)
    return found, bonus


@pytest.mark.parametrize(
    "params",
    [SamplingParams(temperature=1.0), SamplingParams(temperature=0.8, top_k=6, top_p=0.9)],
    ids=["t1", "t0.8-topk6-topp0.9"],
)
def test_every_position_of_a_block_follows_the_target_distribution(params):
    """Rejection sampling with its own randomness, reading the drafter's reported distribution."""
    found, bonus = p_values(params)
    assert bonus > SAMPLES / 20, f"the bonus position was reached only {bonus} times"
    failing = {name: p for name, p in found.items() if p <= ALPHA / TESTS}
    assert not failing, f"SSp with the EAGLE drafter differs from the target at {failing}"


def test_the_test_catches_a_draft_distribution_mapped_through_a_broken_d2t(monkeypatch):
    """The tokens map right (draft id -> target id), the reported distribution one draft id off."""

    right = eagle_module.to_target_logits
    monkeypatch.setattr(eagle_module, "to_target_logits", lambda logits, ids, vocab: right(logits, ids.roll(1), vocab))
    found, _ = p_values(SamplingParams(temperature=1.0))
    assert min(found.values()) <= ALPHA / TESTS, found
