"""eval: the multiplication problems, the answer parser, scoring, and the losslessness check."""

from __future__ import annotations

import pytest
import torch
from conftest import TableBackend
from tools_support import CharTokenizer, pipeline_on, tiny_config, tiny_pipeline

from neuron_ssp.errors import UsageError
from neuron_ssp.speculation.policies import FixedPolicy
from neuron_ssp.tools.eval_math import MathOutcome, MathProblem, first_integer, make_problems, run_math_eval
from neuron_ssp.tools.lossless import check_lossless
from neuron_ssp.tools.prefix_memo import PrefixMemo


def test_problems_are_reproducible_and_in_range():
    problems = make_problems(7, 50)
    assert problems == make_problems(7, 50)
    assert problems != make_problems(8, 50)
    assert all(1 <= p.a <= 99 and 1 <= p.b <= 99 for p in problems)
    assert MathProblem(12, 34).answer == 408 and "12 times 34" in MathProblem(12, 34).prompt


@pytest.mark.parametrize(
    ("text", "number"),
    [
        ("408", 408),
        (" The answer is 1,234.", 1234),
        ("12 x 34 = 408", 12),  # the first integer, as dust-tt/llama2-ssp scores it
        ("-5 degrees", -5),
        ("3,45", 3),
        ("9801!", 9801),
        ("no digits here", None),
        ("", None),
    ],
)
def test_first_integer(text, number):
    assert first_integer(text) == number


def test_outcome_scoring():
    outcome = MathOutcome(MathProblem(11, 11), "121", "The product is 112")
    assert outcome.plain_correct and not outcome.ssp_correct


def test_greedy_plain_and_ssp_answer_identically():
    result = run_math_eval(tiny_pipeline(), make_problems(0, 4), answer_tokens=6)
    assert [o.plain_text for o in result.outcomes] == [o.ssp_text for o in result.outcomes]
    assert result.plain == result.ssp and not result.test.differ()


def test_prefix_memo_returns_the_inner_logits_and_computes_each_prefix_once():
    inner = TableBackend(11, seed=3)
    memo = PrefixMemo(inner)
    prompt = torch.tensor([1, 2, 3])
    first = memo.prefill(prompt)
    assert torch.equal(first, TableBackend(11, seed=3).prefill(prompt))
    rows = memo.score(torch.tensor([4, 5]), 3)
    assert memo.forward_passes == 2  # the inner cache already held the prompt
    memo.prefill(prompt)
    again = memo.score(torch.tensor([4]), 3)
    assert torch.equal(again[0], rows[0]) and memo.forward_passes == 2  # served from memory
    memo.prefill(torch.tensor([7, 8, 9]))  # a new prompt: the inner cache now holds it
    memo.prefill(prompt)  # known: served from memory, the inner cache still holds [7, 8, 9]
    memo.score(torch.tensor([6]), 3)  # unknown prefix: the inner cache is brought back to the prompt first
    assert memo.forward_passes == 5 and inner.calls[-2:] == [(0, 3), (3, 1)]


def test_lossless_check_on_a_lossless_sampler():
    pipeline = pipeline_on(TableBackend(12, seed=0), tiny_config(), CharTokenizer(12))
    report = check_lossless(pipeline, "abcdefghi" * 2, samples=600, temperature=1.0)
    assert report.drafted_share > 0.5  # the repeated text makes the drafter propose
    assert report.estimate.p_value > 0.001
    assert report.estimate.tv < report.estimate.upper_bound < 0.4


def test_lossless_check_counts_only_the_drafts_the_target_checked(monkeypatch):
    """A policy that keeps none of the proposals (the cost policy where drafting does not pay) leaves the
    acceptor unexercised; the report must say so, not count the discarded proposals."""
    monkeypatch.setattr(FixedPolicy, "keep", lambda self, draft, confidence: 0)
    pipeline = pipeline_on(TableBackend(12, seed=0), tiny_config(), CharTokenizer(12))
    report = check_lossless(pipeline, "abcdefghi" * 2, samples=50, temperature=1.0)
    assert report.drafted_share == 0 and report.acceptance_rate == 0


def test_lossless_check_catches_a_lossy_acceptor():
    config = tiny_config(speculation={"acceptor": "typical"})  # documented as lossy
    pipeline = pipeline_on(TableBackend(12, seed=0, sharpness=0.5), config, CharTokenizer(12))
    report = check_lossless(pipeline, "abcdefghi" * 2, samples=600, temperature=1.0)
    assert report.estimate.p_value < 0.01


def test_lossless_check_refuses_greedy():
    with pytest.raises(UsageError, match="temperature"):
        check_lossless(tiny_pipeline(), "abc", samples=10, temperature=0.0)
