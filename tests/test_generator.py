"""The speculative loop: greedy equality, draft = target, EOS / budget inside a block, errors, stats."""

from __future__ import annotations

import pytest
import torch
from conftest import TableBackend, backend, tiny_llama

from neuron_ssp.acceptors import build_acceptor
from neuron_ssp.config import SamplingConfig
from neuron_ssp.drafters import ModelDrafter, NgramDrafter
from neuron_ssp.errors import RuntimeProblem, UsageError
from neuron_ssp.generator import SpeculativeGenerator, plain_generate, sampling_params
from neuron_ssp.policies import AdaptivePolicy, DraftConfidencePolicy, FixedPolicy, TargetConfidencePolicy

GREEDY = SamplingConfig(temperature=0.0)
PROMPT = torch.tensor([1, 5, 7, 9, 5, 7, 11, 13, 5, 7])


def make(target, drafter, k=4, sampling=GREEDY, acceptor="probabilistic", policy=None):
    rng = torch.Generator()
    return SpeculativeGenerator(target, drafter, build_acceptor(acceptor, sampling_params(sampling), rng),
                                policy or FixedPolicy(k), sampling, k, rng)


@pytest.mark.parametrize("k", [2, 3, 5, 8])
@pytest.mark.parametrize("acceptor", ["probabilistic", "greedy"])
@pytest.mark.parametrize("drafter_kind", ["model", "self", "ngram"])
def test_greedy_ssp_equals_plain_greedy(tiny_pair, k, acceptor, drafter_kind):
    target_model, draft_model = tiny_pair
    plain = plain_generate(backend(target_model), PROMPT, 48, GREEDY)
    drafter = {"model": lambda: ModelDrafter(backend(draft_model)),
               "self": lambda: ModelDrafter(backend(target_model)),
               "ngram": lambda: NgramDrafter(target_model.config.vocab_size)}[drafter_kind]()
    result = make(backend(target_model), drafter, k, acceptor=acceptor).generate(PROMPT, 48)
    assert result.tokens == plain.tokens
    assert result.stats.new_tokens == 48


@pytest.mark.parametrize("policy", [
    AdaptivePolicy(5, 2), DraftConfidencePolicy(5, 0.3), TargetConfidencePolicy(5, 0.2),
], ids=["adaptive", "draft-confidence", "target-confidence"])
def test_every_policy_keeps_greedy_output(tiny_pair, policy):
    target_model, draft_model = tiny_pair
    plain = plain_generate(backend(target_model), PROMPT, 40, GREEDY)
    result = make(backend(target_model), ModelDrafter(backend(draft_model)), 5, policy=policy).generate(PROMPT, 40)
    assert result.tokens == plain.tokens


def test_draft_equal_to_target_accepts_everything(tiny_pair):
    target_model, _ = tiny_pair
    result = make(backend(target_model), ModelDrafter(backend(target_model)), 4).generate(PROMPT, 41)
    stats = result.stats
    assert stats.acceptance_rate == 1.0
    assert stats.per_position_acceptance == [1.0, 1.0, 1.0]
    # 1 token from the prefill, then 10 full windows of 4
    assert stats.target_calls == 10 and stats.mean_accepted_length == 4.0


def test_eos_inside_an_accepted_block_stops_there(tiny_pair):
    target_model, _ = tiny_pair
    plain = plain_generate(backend(target_model), PROMPT, 30, GREEDY).tokens
    eos = plain[6]  # a token the target emits in the middle of a 4-token block
    first = plain.index(eos)
    result = make(backend(target_model), ModelDrafter(backend(target_model)), 4).generate(PROMPT, 30, {eos})
    assert result.tokens == plain[: first + 1]
    assert result.stats.new_tokens == first + 1


@pytest.mark.parametrize("budget", [1, 2, 5, 6, 7])
def test_max_new_tokens_inside_a_block_is_exact(tiny_pair, budget):
    target_model, _ = tiny_pair
    plain = plain_generate(backend(target_model), PROMPT, budget, GREEDY).tokens
    result = make(backend(target_model), ModelDrafter(backend(target_model)), 4).generate(PROMPT, budget)
    assert result.tokens == plain and len(result.tokens) == budget


def test_streaming_callback_sees_exactly_the_result(tiny_pair):
    target_model, draft_model = tiny_pair
    streamed: list[int] = []
    result = make(backend(target_model), ModelDrafter(backend(draft_model))).generate(
        PROMPT, 25, on_tokens=streamed.extend)
    assert streamed == result.tokens


def test_n_positions_overflow_is_refused_before_any_call():
    target = TableBackend(16, seed=0, n_positions=20)
    with pytest.raises(UsageError) as err:
        make(target, NgramDrafter(16), 4).generate(PROMPT, 8)  # 10 + 8 + 4 > 20
    problem = err.value.problems[0]
    assert problem.field == "target.n_positions" and "22" in problem.rule and "at least 22" in problem.fix
    assert target.calls == []


def test_window_wider_than_the_compiled_k_is_refused():
    target = TableBackend(16, seed=0)
    target.max_score_width = 4
    with pytest.raises(UsageError, match="compiled window"):
        make(target, NgramDrafter(16), 5)


def test_sampling_is_reproducible_with_a_seed():
    sampling = SamplingConfig(temperature=1.0, seed=7)
    runs = [make(TableBackend(16, 0), ModelDrafter(TableBackend(16, 1)), sampling=sampling).generate(PROMPT, 30)
            for _ in range(2)]
    assert runs[0].tokens == runs[1].tokens
    other = make(TableBackend(16, 0), ModelDrafter(TableBackend(16, 1)),
                 sampling=SamplingConfig(temperature=1.0, seed=8)).generate(PROMPT, 30)
    assert other.tokens != runs[0].tokens


def test_target_scores_the_last_token_plus_the_draft_at_their_positions():
    target = TableBackend(16, 0)
    make(target, ModelDrafter(TableBackend(16, 0)), 4).generate(PROMPT, 9)
    # prefill 10 slots; then windows of 4 starting at the last committed token's slot
    assert target.calls == [(0, 10), (10, 4), (14, 4)]


def test_an_acceptor_that_breaks_the_contract_is_named():
    class Bad:
        def __call__(self, draft_ids, draft_scores, target_scores):
            return torch.tensor([[3, 3, 3, 3, 3, 3]])

    gen = make(TableBackend(16, 0), ModelDrafter(TableBackend(16, 1)))
    gen.acceptor = Bad()
    with pytest.raises(RuntimeProblem, match="acceptor must return"):
        gen.generate(PROMPT, 10)


def test_stats_time_split_adds_up(tiny_pair):
    target_model, draft_model = tiny_pair
    stats = make(backend(target_model), ModelDrafter(backend(draft_model))).generate(PROMPT, 30).stats
    assert stats.time_draft_s > 0 and stats.time_target_s > 0
    assert abs(stats.time_draft_s + stats.time_target_s + stats.time_overhead_s - stats.wall_s) < 1e-6
    assert stats.tokens_per_s == pytest.approx(30 / stats.wall_s)


def test_plain_decoding_through_a_different_model_diverges(tiny_pair):
    """Guards the equality tests above against comparing a model with itself by accident."""
    target_model, draft_model = tiny_pair
    assert plain_generate(backend(target_model), PROMPT, 20, GREEDY).tokens != \
        plain_generate(backend(tiny_llama(5)), PROMPT, 20, GREEDY).tokens
    assert draft_model is not target_model
