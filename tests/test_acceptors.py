"""Acceptors and the sampling transform, tested without any model."""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch

from neuron_ssp.errors import UsageError
from neuron_ssp.speculation.acceptors import (
    GreedyAcceptor,
    ProbabilisticAcceptor,
    TokenAcceptor,
    TypicalAcceptor,
    ZeroPaddedAcceptor,
    build_acceptor,
)
from neuron_ssp.speculation.sampling import SamplingParams, first_non_finite_row, logits_to_probs, sample


def test_greedy_acceptor_keeps_the_agreeing_prefix_then_the_target_token():
    target = torch.full((1, 4, 6), -5.0)
    for pos, tok in enumerate([2, 3, 4, 5]):
        target[0, pos, tok] = 5.0
    out = GreedyAcceptor()(torch.tensor([[2, 3, 1]]), torch.zeros(1, 3, 6), target)
    assert out.tolist() == [[2, 3, 4]]
    full = GreedyAcceptor()(torch.tensor([[2, 3, 4]]), torch.zeros(1, 3, 6), target)
    assert full.tolist() == [[2, 3, 4, 5]]


def test_probabilistic_accepts_a_token_the_target_prefers():
    target = torch.tensor([[[0.0, 10.0, -30.0], [0.0, 0.0, 0.0]]])
    acceptor = ProbabilisticAcceptor(SamplingParams(temperature=1.0), torch.Generator().manual_seed(0))
    assert acceptor(torch.tensor([[1]]), torch.zeros(1, 1, 3), target)[0, 0] == 1


def test_probabilistic_keeps_with_p_over_q_and_resamples_from_the_residual():
    """p = (0.85, 0.10, 0.05), q = (0.90, 0, 0.10), drafted token 2: kept with probability p(2)/q(2) = 1/2;
    a rejection draws from norm(max(0, p - q)) = (0, 1, 0), so always token 1, which p alone draws one time
    in ten (resampling from p would give token 0 most of the time, from q never token 1)."""
    p, q = torch.tensor([0.85, 0.10, 0.05]), torch.tensor([0.90, 0.0, 0.10])
    target = torch.stack([p.log(), torch.zeros(3)]).unsqueeze(0)  # the second row: the bonus token's
    draft = q.log().view(1, 1, 3)
    acceptor = ProbabilisticAcceptor(SamplingParams(temperature=1.0), torch.Generator().manual_seed(0))
    draws = 4000
    outcomes = [tuple(acceptor(torch.tensor([[2]]), draft, target)[0].tolist()) for _ in range(draws)]
    rejections = [out for out in outcomes if len(out) == 1]
    assert set(rejections) == {(1,)}  # every rejection: the residual's only token
    assert all(out[0] == 2 for out in outcomes if len(out) == 2)  # a kept draft, then the bonus token
    assert abs(len(rejections) / draws - 0.5) < 4 * (0.25 / draws) ** 0.5  # within 4 sigma of 1 - p(2)/q(2)


@pytest.mark.parametrize("seed", range(5))
def test_probabilistic_at_temperature_0_keeps_what_rejection_sampling_keeps(seed):
    """The greedy shortcut against the rule itself: at a temperature low enough that p and q are point
    masses numerically, rejection sampling keeps and adds exactly the tokens the shortcut returns,
    drafts that are not the draft's own argmax included."""
    gen = torch.Generator().manual_seed(seed)
    vocab, m = 50, 6
    target = torch.randn(1, m + 1, vocab, generator=gen) * 3
    draft_scores = torch.randn(1, m, vocab, generator=gen) * 3
    ids = target[0, :m].argmax(-1)
    ids[int(torch.randint(m, (1,), generator=gen))] = int(torch.randint(vocab, (1,), generator=gen))
    ids[-1] = int(draft_scores[0, -1].argmax())
    greedy = ProbabilisticAcceptor(SamplingParams(0.0))(ids.view(1, -1), draft_scores, target)
    cold = ProbabilisticAcceptor(SamplingParams(1e-4), torch.Generator().manual_seed(seed))
    assert greedy.tolist() == cold(ids.view(1, -1), draft_scores, target).tolist()
    assert greedy.tolist() == GreedyAcceptor()(ids.view(1, -1), draft_scores, target).tolist()


@pytest.mark.parametrize("temperature", [1e-206, 1e-30, 5e-324])
def test_a_vanishing_temperature_samples_the_argmax_not_nan(temperature):
    """logits / 1e-206 overflow to inf, and softmax(inf - inf) was NaN: `torch.multinomial` then raised and
    the server answered 500 (schemathesis found it with temperature 1.66e-206)."""
    logits = torch.tensor([[2.0, 7.5, -1.0, float("-inf")], [3.0, 3.0, 1.0, 0.0]])
    for top_k, top_p in ((0, 1.0), (2, 1.0), (0, 0.5)):
        probs = logits_to_probs(logits, SamplingParams(temperature, top_k=top_k, top_p=top_p))
        assert probs[0].tolist() == [0.0, 1.0, 0.0, 0.0]
        assert probs[1].tolist() == [0.5, 0.5, 0.0, 0.0] or top_p < 1.0  # a tie keeps both; top_p 0.5 keeps one
        assert torch.isfinite(probs).all() and torch.allclose(probs.sum(-1), torch.ones(2))


def test_top_k_and_top_p_truncate_the_distribution():
    logits = torch.tensor([3.0, 2.0, 1.0, 0.0])
    assert (logits_to_probs(logits, SamplingParams(1.0, top_k=2))[2:] == 0).all()
    probs = logits_to_probs(logits, SamplingParams(1.0, top_p=0.7))
    assert probs[0] > 0 and probs[1] > 0 and probs[3] == 0  # the token crossing 0.7 is kept
    assert torch.isclose(probs.sum(), torch.tensor(1.0))
    assert logits_to_probs(logits, SamplingParams(0.0)).tolist() == [1.0, 0.0, 0.0, 0.0]


@pytest.mark.parametrize("top_p", [1e-46, 5e-324, 1e-9])
def test_a_vanishing_top_p_keeps_the_most_likely_token(top_p):
    """top_p 1e-46 is 0 in fp32, and every token was dropped: softmax of all -inf is NaN, and
    `torch.multinomial` raised (a 500 through the server). The nucleus always holds the most likely token."""
    logits = torch.tensor([[2.0, 7.5, -1.0, float("-inf")], [0.5, 0.0, 4.0, 1.0]])
    probs = logits_to_probs(logits, SamplingParams(1.0, top_p=top_p))
    assert probs.tolist() == [[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]]
    assert sample(probs, torch.Generator().manual_seed(0)).tolist() == [1, 2]


def test_zero_padded_results_are_counted_like_transformers_neuronx():
    class LibraryStyle:
        def __call__(self, draft_ids, draft_scores, target_scores):
            return torch.tensor([[7, 9, 0, 0]])

    adapted = ZeroPaddedAcceptor(LibraryStyle())
    assert adapted(torch.tensor([[7, 8, 8]]), torch.zeros(1, 3, 10), torch.zeros(1, 4, 10)).tolist() == [[7, 9]]


@pytest.fixture
def plugin_module(tmp_path, monkeypatch):
    (tmp_path / "my_acceptors.py").write_text(
        textwrap.dedent("""
        import torch
        from neuron_ssp.speculation.acceptors import TokenAcceptor

        class FirstOnly(TokenAcceptor):
            def __call__(self, draft_ids, draft_scores, target_scores):
                return target_scores[:, :1].argmax(-1)

        class NoCall:
            pass

        class Padded:
            def __call__(self, draft_ids, draft_scores, target_scores):
                return torch.zeros(1, target_scores.shape[1], dtype=torch.long)
    """)
    )
    (tmp_path / "broken_plugin.py").write_text("import does_not_exist\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    for name in ("my_acceptors", "broken_plugin"):
        sys.modules.pop(name, None)


def test_plugin_subclassing_ours_is_used_as_is(plugin_module):
    acceptor = build_acceptor("my_acceptors:FirstOnly", SamplingParams(), None)
    assert isinstance(acceptor, TokenAcceptor) and type(acceptor).__name__ == "FirstOnly"


def test_foreign_plugin_is_wrapped_with_the_library_convention(plugin_module):
    assert isinstance(build_acceptor("my_acceptors:Padded", SamplingParams(), None), ZeroPaddedAcceptor)


@pytest.mark.parametrize(
    "spec, message",
    [
        ("nonsense", "unknown acceptor"),
        ("no_such_module_xyz:Thing", "does not import"),
        ("broken_plugin:Thing", "does not import"),
        ("my_acceptors:Missing", "has no 'Missing'"),
        ("my_acceptors:NoCall", "not a class with __call__"),
    ],
)
def test_bad_plugins_are_named(plugin_module, spec, message):
    with pytest.raises(UsageError) as err:
        build_acceptor(spec, SamplingParams(), None)
    problem = err.value.problems[0]
    assert problem.field == "speculation.acceptor" and problem.value == spec and message in problem.rule


# ---------------------------------------------------------------- non-finite scores, greedy with a temperature


def nan_at_the_drafted_token(where: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores for one drafted token (id 2) with a NaN in the draft's or the target's row at that token."""
    draft, target = torch.zeros(1, 1, 4), torch.zeros(1, 2, 4)
    (draft if where == "draft" else target)[0, 0, 2] = float("nan")
    return draft, target


def test_a_nan_in_the_draft_rejects_the_draft_token():
    """`u*q >= p` is False for a NaN, which used to accept the draft token."""
    draft, target = nan_at_the_drafted_token("draft")
    acceptor = ProbabilisticAcceptor(SamplingParams(temperature=1.0), torch.Generator().manual_seed(0))
    for _ in range(20):
        out = acceptor(torch.tensor([[2]]), draft, target)
        assert out.shape == (1, 1)  # rejected at the draft token; accepted would read [[2, bonus]]


def test_a_nan_in_the_target_is_an_error_never_an_accepted_draft():
    """A NaN target row leaves nothing to resample from: the acceptor must raise (the engine checks the
    logits first and names the position), never keep the draft token and carry on."""
    draft, target = nan_at_the_drafted_token("target")
    acceptor = ProbabilisticAcceptor(SamplingParams(temperature=1.0), torch.Generator().manual_seed(0))
    for _ in range(20):
        with pytest.raises(RuntimeError):
            acceptor(torch.tensor([[2]]), draft, target)


def test_a_nan_draft_row_falls_back_to_the_target_distribution():
    params = SamplingParams(temperature=1.0)
    target = torch.tensor([[[0.0, 20.0, 0.0], [0.0, 0.0, 0.0]]])
    draft = torch.full((1, 1, 3), float("nan"))
    out = ProbabilisticAcceptor(params, torch.Generator().manual_seed(0))(torch.tensor([[2]]), draft, target)
    assert out.tolist() == [[1]]


def test_greedy_acceptor_refuses_a_temperature():
    with pytest.raises(UsageError) as err:
        GreedyAcceptor(SamplingParams(temperature=0.7))
    problem = err.value.problems[0]
    assert problem.field == "speculation.acceptor" and "0.7" in problem.rule and "probabilistic" in problem.fix
    with pytest.raises(UsageError):
        build_acceptor("greedy", SamplingParams(temperature=1.0), None)
    assert isinstance(build_acceptor("greedy", SamplingParams(temperature=0.0), None), GreedyAcceptor)


def test_typical_keeps_a_plausible_token_the_draft_over_weights():
    """Typical acceptance keeps d when p(d) > min(threshold, alpha * exp(-H(p))), however sure the draft
    was; rejection sampling keeps it with probability p(d)/q(d) only. That difference is what makes it
    lossy (tests/test_lossless.py shows the output distribution moves)."""
    target = torch.tensor([[[0.0, 0.0, 0.0, 0.0, -10.0], [0.0] * 5]])  # p ≈ 1/4 for ids 0-3, ~0 for 4
    sure_draft = torch.tensor([[[-10.0, 10.0, -10.0, -10.0, -10.0]]])  # q(1) ≈ 1
    params = SamplingParams(temperature=1.0)
    typical = TypicalAcceptor(params, torch.Generator().manual_seed(0))
    probabilistic = ProbabilisticAcceptor(params, torch.Generator().manual_seed(0))
    trials = 200
    assert all(typical(torch.tensor([[1]]), sure_draft, target)[0, 0] == 1 for _ in range(trials))
    kept = sum(int(probabilistic(torch.tensor([[1]]), sure_draft, target)[0, 0] == 1) for _ in range(trials))
    # about p(1)/q(1) = 1/4; after a rejection the residual max(0, p - q) is 0 at id 1, so no resample reads as kept
    assert 0.1 * trials < kept < 0.45 * trials
    for _ in range(20):  # p(4) ≈ 2e-5 is below the bar (0.3 * e^-H ≈ 0.075): rejected
        out = typical(torch.tensor([[4]]), sure_draft, target)
        assert out.shape == (1, 1) and out[0, 0] != 4


def test_an_unknown_builtin_name_gets_the_nearest_one():
    with pytest.raises(UsageError) as err:
        build_acceptor("probabalistic", SamplingParams(), None)
    assert "did you mean 'probabilistic'?" in err.value.problems[0].fix


@pytest.mark.parametrize(
    ("bad_row", "expected"),
    [
        (None, None),  # every row usable
        ([0.0, float("-inf"), 1.0, 2.0], None),  # one impossible token is allowed
        ([3e38, 3e38, 0.0, 0.0], None),  # finite, though its sum overflows
        ([0.0, float("nan"), 1.0, 2.0], 2),
        ([0.0, float("inf"), 1.0, 2.0], 2),
        ([float("-inf")] * 4, 2),  # no distribution left
    ],
)
def test_first_non_finite_row_names_the_first_unusable_row(bad_row, expected):
    logits = torch.randn(4, 4)
    if bad_row is not None:
        logits[2] = torch.tensor(bad_row)
        logits[3] = float("nan")
        expected = expected if expected is not None else 3
    assert first_non_finite_row(logits) == expected
