"""The generator's server hooks: per-step commit reports (token origin) and the once-per-iteration cancel."""

from __future__ import annotations

import torch
from conftest import backend, tiny_llama

from neuron_ssp.config import SamplingConfig
from neuron_ssp.drafters import ModelDrafter
from neuron_ssp.engines.base import sampling_params
from neuron_ssp.engines.native import SpeculativeGenerator
from neuron_ssp.speculation.acceptors import build_acceptor
from neuron_ssp.speculation.policies import FixedPolicy

GREEDY = SamplingConfig(temperature=0.0)
PROMPT = torch.tensor([1, 5, 7, 9, 5, 7, 11, 13, 5, 7])


def make(target_model, draft_model, k=4):
    rng = torch.Generator()
    return SpeculativeGenerator(
        backend(target_model),
        ModelDrafter(backend(draft_model), sampling_params(GREEDY), rng),
        build_acceptor("probabilistic", sampling_params(GREEDY), rng),
        FixedPolicy(k),
        GREEDY,
        k,
        rng,
    )


def test_commit_reports_add_up_to_the_result_and_its_stats(tiny_pair):
    steps: list[tuple[list[int], int | None, int]] = []
    result = make(*tiny_pair).generate(PROMPT, 40, on_commit=lambda t, a, d: steps.append((t, a, d)))
    assert [t for tokens, _, _ in steps for t in tokens] == result.tokens
    assert steps[0][1:] == (0, 0)  # the prefill's token: chosen by the target, nothing drafted
    assert sum(a for _, a, _ in steps) == result.stats.accepted_tokens
    assert sum(d for _, _, d in steps) == result.stats.draft_tokens
    assert len(steps) - 1 == result.stats.target_calls
    assert all(0 <= a <= len(t) and a <= d for t, a, d in steps)


def test_draft_equal_to_target_reports_every_drafted_token_as_accepted():
    model = tiny_llama(0)
    steps: list[tuple[list[int], int | None, int]] = []
    make(model, model, k=4).generate(PROMPT, 13, on_commit=lambda t, a, d: steps.append((t, a, d)))
    assert all(a == d == 3 and len(t) == 4 for t, a, d in steps[1:])  # 3 accepted drafts + 1 bonus each


def test_should_stop_ends_the_loop_at_the_next_iteration(tiny_pair):
    asked: list[int] = []
    committed: list[int] = []

    def stop_after_two() -> bool:
        asked.append(len(committed))
        return len(asked) > 2

    result = make(*tiny_pair).generate(PROMPT, 40, on_tokens=committed.extend, should_stop=stop_after_two)
    assert len(asked) == 3 and result.stats.target_calls == 2  # asked once per iteration, stopped on the third
    assert result.tokens == committed and len(result.tokens) < 40
