"""The speculative loop: greedy equality, draft = target, EOS / budget inside a block, errors, stats."""

from __future__ import annotations

import time

import pytest
import torch
from conftest import TableBackend, backend, tiny_llama

from neuron_ssp.backends.base import SingleSlot
from neuron_ssp.config import SamplingConfig
from neuron_ssp.drafters import Draft, ModelDrafter, NgramDrafter
from neuron_ssp.drafters.base import point_masses
from neuron_ssp.engines.base import sampling_params
from neuron_ssp.engines.native import SpeculativeGenerator, plain_generate
from neuron_ssp.errors import RuntimeProblem, UsageError
from neuron_ssp.speculation.acceptors import ProbabilisticAcceptor, build_acceptor
from neuron_ssp.speculation.policies import AdaptivePolicy, FixedPolicy, TargetConfidencePolicy

GREEDY = SamplingConfig(temperature=0.0)
PROMPT = torch.tensor([1, 5, 7, 9, 5, 7, 11, 13, 5, 7])


def make(target, drafter, k=4, sampling=GREEDY, acceptor="probabilistic", policy=None, stop_below=0.0):
    """A generator; `drafter` is a Drafter, or a draft backend to wrap in a ModelDrafter sharing the rng."""
    rng = torch.Generator()
    if hasattr(drafter, "prefill"):
        drafter = ModelDrafter(drafter, sampling_params(sampling), rng, stop_below)
    return SpeculativeGenerator(
        target,
        drafter,
        build_acceptor(acceptor, sampling_params(sampling), rng),
        policy or FixedPolicy(k),
        sampling,
        k,
        rng,
    )


@pytest.mark.parametrize("k", [2, 3, 5, 8])
@pytest.mark.parametrize("acceptor", ["probabilistic", "greedy"])
@pytest.mark.parametrize("drafter_kind", ["model", "self", "ngram"])
def test_greedy_ssp_equals_plain_greedy(tiny_pair, k, acceptor, drafter_kind):
    target_model, draft_model = tiny_pair
    plain = plain_generate(backend(target_model), PROMPT, 48, GREEDY)
    drafter = {
        "model": lambda: backend(draft_model),
        "self": lambda: backend(target_model),
        "ngram": lambda: NgramDrafter(target_model.config.vocab_size),
    }[drafter_kind]()
    result = make(backend(target_model), drafter, k, acceptor=acceptor).generate(PROMPT, 48)
    assert result.tokens == plain.tokens
    assert result.stats.new_tokens == 48


@pytest.mark.parametrize(
    "policy, stop_below",
    [
        (AdaptivePolicy(5, 2), 0.0),
        (FixedPolicy(5), 0.3),
        (TargetConfidencePolicy(5, 0.2), 0.0),
    ],
    ids=["adaptive", "draft-confidence", "target-confidence"],
)
def test_every_policy_keeps_greedy_output(tiny_pair, policy, stop_below):
    target_model, draft_model = tiny_pair
    plain = plain_generate(backend(target_model), PROMPT, 40, GREEDY)
    result = make(backend(target_model), backend(draft_model), 5, policy=policy, stop_below=stop_below).generate(
        PROMPT, 40
    )
    assert result.tokens == plain.tokens


def test_draft_equal_to_target_accepts_everything(tiny_pair):
    target_model, _ = tiny_pair
    result = make(backend(target_model), backend(target_model), 4).generate(PROMPT, 41)
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
    result = make(backend(target_model), backend(target_model), 4).generate(PROMPT, 30, {eos})
    assert result.tokens == plain[: first + 1]
    assert result.stats.new_tokens == first + 1


@pytest.mark.parametrize("budget", [1, 2, 5, 6, 7])
def test_max_new_tokens_inside_a_block_is_exact(tiny_pair, budget):
    target_model, _ = tiny_pair
    plain = plain_generate(backend(target_model), PROMPT, budget, GREEDY).tokens
    result = make(backend(target_model), backend(target_model), 4).generate(PROMPT, budget)
    assert result.tokens == plain and len(result.tokens) == budget


def test_streaming_callback_sees_exactly_the_result(tiny_pair):
    target_model, draft_model = tiny_pair
    streamed: list[int] = []
    result = make(backend(target_model), backend(draft_model)).generate(PROMPT, 25, on_tokens=streamed.extend)
    assert streamed == result.tokens


def test_window_wider_than_the_compiled_k_is_refused():
    target = TableBackend(16, seed=0)
    target.max_score_width = 4
    with pytest.raises(UsageError, match="compiled window"):
        make(target, NgramDrafter(16), 5)


def test_a_vanishing_temperature_decodes_like_greedy(tiny_pair):
    """Plain and speculative decoding at temperature 1e-206 (valid for the API) give the greedy tokens."""
    target_model, draft_model = tiny_pair
    greedy = plain_generate(backend(target_model), PROMPT, 24, GREEDY).tokens
    tiny = SamplingConfig(temperature=1e-206, seed=3)
    assert plain_generate(backend(target_model), PROMPT, 24, tiny).tokens == greedy
    assert make(backend(target_model), backend(draft_model), 4, sampling=tiny).generate(PROMPT, 24).tokens == greedy


def test_sampling_is_reproducible_with_a_seed():
    sampling = SamplingConfig(temperature=1.0, seed=7)
    runs = [make(TableBackend(16, 0), TableBackend(16, 1), sampling=sampling).generate(PROMPT, 30) for _ in range(2)]
    assert runs[0].tokens == runs[1].tokens
    other = make(TableBackend(16, 0), TableBackend(16, 1), sampling=SamplingConfig(temperature=1.0, seed=8)).generate(
        PROMPT, 30
    )
    assert other.tokens != runs[0].tokens


def test_target_scores_the_last_token_plus_the_draft_at_their_positions():
    target = TableBackend(16, 0)
    make(target, TableBackend(16, 0), 4).generate(PROMPT, 9)
    # prefill 10 slots; then windows of 4 starting at the last committed token's slot
    assert target.calls == [(0, 10), (10, 4), (14, 4)]


def test_an_acceptor_that_breaks_the_contract_is_named():
    class Bad:
        def __call__(self, draft_ids, draft_scores, target_scores):
            return torch.tensor([[3, 3, 3, 3, 3, 3]])

    gen = make(TableBackend(16, 0), TableBackend(16, 1))
    gen.acceptor = Bad()
    with pytest.raises(RuntimeProblem, match="acceptor must return"):
        gen.generate(PROMPT, 10)


def test_plain_decoding_through_a_different_model_diverges(tiny_pair):
    """Guards the equality tests above against comparing a model with itself by accident."""
    target_model, draft_model = tiny_pair
    assert (
        plain_generate(backend(target_model), PROMPT, 20, GREEDY).tokens
        != plain_generate(backend(tiny_llama(5)), PROMPT, 20, GREEDY).tokens
    )
    assert draft_model is not target_model


# ---------------------------------------------------------------- non-finite logits stop generation


class NanAt(TableBackend):
    """A table LM whose logits turn NaN (or +inf) once a slot at or past `bad_slot` is scored."""

    def __init__(self, bad_slot: int, value: float = float("nan"), **kwargs):
        super().__init__(16, 0, **kwargs)
        self.bad_slot = bad_slot
        self.value = value

    def score(self, token_ids, start):
        logits = super().score(token_ids, start)
        for row in range(len(token_ids)):
            if start + row >= self.bad_slot:
                logits[row, 3] = self.value
        return logits


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
@pytest.mark.parametrize("drafter", ["model", "none"])
def test_non_finite_target_logits_stop_generation_and_name_the_position(value, drafter):
    target = NanAt(bad_slot=13, value=value)
    draft = TableBackend(16, 0) if drafter == "model" else NgramDrafter(16, 3, 3)
    emitted: list[int] = []
    with pytest.raises(RuntimeProblem) as err:
        make(target, draft, 4, sampling=SamplingConfig(temperature=1.0)).generate(PROMPT, 20, on_tokens=emitted.extend)
    problem = err.value.problems[0]
    assert "non-finite logits" in problem.rule and "position 13" in problem.rule
    assert len(emitted) <= 13 - len(PROMPT) + 1  # nothing scored from the bad slot on was emitted


def test_plain_decoding_refuses_non_finite_logits_too():
    with pytest.raises(RuntimeProblem, match="position 12"):
        plain_generate(NanAt(bad_slot=12), PROMPT, 10, GREEDY)


# ---------------------------------------------------------------- the time split, measured apart


class Timed(SingleSlot):
    """Wraps a backend and adds up the seconds spent inside its calls, measured apart from the stats."""

    def __init__(self, inner, sleep_s: float, prefill_sleep_s: float = 0.0):
        self.inner, self.sleep_s, self.prefill_sleep_s, self.seconds = inner, sleep_s, prefill_sleep_s, 0.0
        self.vocab_size, self.n_positions, self.name = inner.vocab_size, inner.n_positions, inner.name
        self.max_score_width = None

    def _timed(self, call, *args, sleep_s=None):
        start = time.perf_counter()
        time.sleep(self.sleep_s if sleep_s is None else sleep_s)
        out = call(*args)
        self.seconds += time.perf_counter() - start
        return out

    def prefill(self, prompt_ids):
        return self._timed(self.inner.prefill, prompt_ids, sleep_s=self.prefill_sleep_s or self.sleep_s)

    def score(self, token_ids, start):
        return self._timed(self.inner.score, token_ids, start)


class SlowAcceptor(ProbabilisticAcceptor):
    """Loop work outside every model call: it must land in the overhead, nowhere else."""

    def __call__(self, draft_ids, draft_scores, target_scores):
        time.sleep(0.004)
        return super().__call__(draft_ids, draft_scores, target_scores)


class TimedDrafter:
    """Adds up the seconds spent inside the drafter (its model calls and its own work)."""

    def __init__(self, inner):
        self.inner, self.seconds = inner, 0.0

    def begin(self, prompt_ids, max_new_tokens, noise=None):
        start = time.perf_counter()
        self.inner.begin(prompt_ids, max_new_tokens, noise)
        self.seconds += time.perf_counter() - start

    def propose(self, sequence, max_tokens):
        start = time.perf_counter()
        draft = self.inner.propose(sequence, max_tokens)
        self.seconds += time.perf_counter() - start
        return draft

    def finish(self, sequence):
        self.inner.finish(sequence)


@pytest.mark.parametrize("slow_loop", [False, True])
def test_time_split_matches_model_time_measured_outside_the_stats(slow_loop):
    # the draft's prompt encoding is slow: it must be charged to the draft, not to the target
    target, draft = Timed(TableBackend(16, 0), 0.002), Timed(TableBackend(16, 1), 0.001, prefill_sleep_s=0.05)
    gen = make(target, draft, 4, sampling=SamplingConfig(temperature=1.0))
    gen.drafter = drafter = TimedDrafter(gen.drafter)
    if slow_loop:
        gen.acceptor = SlowAcceptor(gen.params, gen.rng)
    begin = time.perf_counter()
    stats = gen.generate(PROMPT, 40).stats
    outside = time.perf_counter() - begin
    slack = 0.0005 * len(target.inner.calls) + 0.005  # each bracket adds a clock read, never removes time
    assert target.seconds <= stats.time_target_s <= target.seconds + slack
    assert draft.seconds <= stats.time_draft_s <= drafter.seconds + slack
    assert stats.wall_s <= outside
    assert stats.time_overhead_s <= stats.wall_s - target.seconds - draft.seconds
    if slow_loop:
        assert stats.time_overhead_s >= 0.004 * stats.num_drafts


def test_model_times_fit_inside_the_wall_time(tiny_pair):
    """Overhead is wall - draft - target clamped at 0, so a second clock around the same call (or the
    draft's time counted as the target's too) would hide in the clamp: draft + target must fit in wall."""
    target_model, draft_model = tiny_pair
    stats = make(backend(target_model), backend(draft_model)).generate(PROMPT, 30).stats
    assert stats.time_draft_s > 0 and stats.time_target_s > 0
    assert stats.time_draft_s + stats.time_target_s <= stats.wall_s
    assert stats.new_tokens == 30


# ---------------------------------------------------------------- stats after EOS


class FixedDraft:
    """A drafter that always proposes the given tokens (a point mass each)."""

    def __init__(self, tokens: list[int]):
        self.tokens = torch.tensor(tokens)

    def begin(self, prompt_ids, max_new_tokens, noise=None):
        pass

    def propose(self, sequence, max_tokens):
        tokens = self.tokens[:max_tokens]
        return Draft(tokens, point_masses(tokens, 16))

    def finish(self, sequence):
        pass


def test_draft_tokens_accepted_after_eos_do_not_count():
    """The target agrees with the whole draft [a, EOS, c]; the sequence ends at EOS, so c is neither
    accepted nor proposed, and the committed block is [a, EOS]."""
    target = TableBackend(16, 0)
    first = plain_generate(TableBackend(16, 0), PROMPT, 4, GREEDY).tokens
    eos = first[2]
    gen = make(target, FixedDraft(first[1:4]), 4, acceptor="greedy")
    result = gen.generate(PROMPT, 10, {eos})
    assert result.tokens == first[:3]
    stats = result.stats
    assert (stats.target_calls, stats.num_drafts, stats.draft_tokens, stats.accepted_tokens) == (1, 1, 2, 2)
    assert stats.per_position_acceptance == [1.0, 1.0, None]
    assert stats.mean_accepted_length == 2.0 and stats.vllm_mean_acceptance_length == 3.0


# ---------------------------------------------------------------- the drafter interface


class NarrowDrafter:
    """A drafter written against the narrow interface: committed tokens in, at most max_tokens out."""

    def __init__(self):
        self.asked: list[int] = []

    def begin(self, prompt_ids, max_new_tokens, noise=None):
        self.budget = max_new_tokens

    def propose(self, sequence, max_tokens):
        self.asked.append(max_tokens)
        if len(sequence) % 2:
            return Draft.empty(16)
        guess = sequence[-max_tokens:]
        return Draft(guess, point_masses(guess, 16))

    def finish(self, sequence):
        self.finished = sequence.tolist()


def test_a_drafter_needs_only_the_sequence_and_a_count():
    drafter = NarrowDrafter()
    result = make(TableBackend(16, 0), drafter, 4).generate(PROMPT, 25)
    assert result.tokens == plain_generate(TableBackend(16, 0), PROMPT, 25, GREEDY).tokens
    assert drafter.budget == 25 and drafter.asked and max(drafter.asked) == 3
    assert len(Draft.empty(16)) == 0 and Draft.empty(16).logits.shape == (0, 16)
