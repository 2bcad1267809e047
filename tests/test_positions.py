"""The n_positions rule: exactly the slots a generation writes, checked the same way by `validate`
(topology) and before the first call (generator, model drafter), so a config that passes `validate`
never fails mid-generation on a full KV cache, and none is refused that would fit."""

from __future__ import annotations

import pytest
import torch
from conftest import TableBackend

from neuron_ssp.config import SamplingConfig, config_from_dict
from neuron_ssp.drafters import ModelDrafter
from neuron_ssp.engines.base import sampling_params
from neuron_ssp.engines.native import SpeculativeGenerator, plain_generate
from neuron_ssp.errors import UsageError
from neuron_ssp.speculation.acceptors import build_acceptor
from neuron_ssp.speculation.policies import AdaptivePolicy, FixedPolicy, TargetConfidencePolicy
from neuron_ssp.topology import validate_config
from neuron_ssp.topology.positions import draft_slots, extra_target_slots, max_new_tokens_within, target_slots

PROMPT = torch.tensor([1, 5, 7, 9, 5, 7, 11, 13, 5, 7])
P = len(PROMPT)
VOCAB = 16


def generator(target, draft, k, policy=None, temperature=1.0):
    sampling = SamplingConfig(temperature=temperature, seed=3)
    rng = torch.Generator()
    params = sampling_params(sampling)
    return SpeculativeGenerator(
        target,
        ModelDrafter(draft, params, rng),
        build_acceptor("probabilistic", params, rng),
        policy or FixedPolicy(k),
        sampling,
        k,
        rng,
    )


@pytest.mark.parametrize("k", [2, 4, 7])
@pytest.mark.parametrize("new", [1, 2, 3, 9, 20])
@pytest.mark.parametrize("policy", ["fixed", "adaptive", "target-confidence"])
def test_the_highest_slot_written_is_p_plus_n_minus_2(k, new, policy):
    """Measured, not argued: a draft that agrees often (so whole windows reach the budget) and one
    that rarely does, every policy; the target's highest slot is P+N-2, the draft's at most P+N-3."""
    for noise in (0.3, 3.0):
        target = TableBackend(VOCAB, 0, sharpness=3.0, flat_share=0.3)
        draft = target.perturbed(noise, seed=1)
        chosen = {
            "fixed": FixedPolicy(k),
            "adaptive": AdaptivePolicy(k, 2),
            "target-confidence": TargetConfidencePolicy(k, 0.5),
        }[policy]
        result = generator(target, draft, k, chosen).generate(PROMPT, new)
        assert len(result.tokens) == new
        assert target.highest_slot == P + new - 2  # the prompt alone (P - 1) when new == 1
        assert target.highest_slot + 1 == target_slots(P, new)
        assert draft.highest_slot + 1 <= draft_slots(P, new)


@pytest.mark.parametrize("new", [2, 8, 30])
def test_exactly_the_needed_positions_are_enough_and_one_less_is_refused(new):
    needed = target_slots(P, new)
    result = generator(TableBackend(VOCAB, 0, n_positions=needed), TableBackend(VOCAB, 1), 4).generate(PROMPT, new)
    assert len(result.tokens) == new  # a TableBackend of `needed` slots fails on any write past them
    assert len(plain_generate(TableBackend(VOCAB, 0, n_positions=needed), PROMPT, new, SamplingConfig()).tokens) == new
    short = TableBackend(VOCAB, 0, n_positions=needed - 1)
    with pytest.raises(UsageError) as err:
        generator(short, TableBackend(VOCAB, 1), 4).generate(PROMPT, new)
    problem = err.value.problems[0]
    assert problem.field == "target.n_positions" and f"at least {needed}" in problem.fix
    assert short.calls == []


def test_the_draft_models_room_is_checked_before_any_call():
    new = 12
    target, draft = TableBackend(VOCAB, 0), TableBackend(VOCAB, 1, n_positions=draft_slots(P, new) - 1)
    with pytest.raises(UsageError) as err:
        generator(target, draft, 4).generate(PROMPT, new)
    problem = err.value.problems[0]
    assert problem.field == "draft.n_positions" and f"at least {draft_slots(P, new)}" in problem.fix
    assert target.calls == [] and draft.calls == []
    enough = TableBackend(VOCAB, 1, n_positions=draft_slots(P, new))
    assert len(generator(TableBackend(VOCAB, 0), enough, 4).generate(PROMPT, new).tokens) == new


def _validate(target_positions: int, draft_positions: int, engine: str = "native") -> set[str]:
    config = config_from_dict(
        {
            "target": {"path": "/models/t", "n_positions": target_positions},
            "draft": {"path": "/models/d", "n_positions": draft_positions},
            "speculation": {"k": 5, "drafter": "model", "engine": engine},
            "generation": {"max_prompt_tokens": 100, "max_new_tokens": 50},
        }
    )
    return {p.field for p in validate_config(config).errors}


def test_validate_uses_the_same_exact_rule():
    assert _validate(149, 148) == set()  # 100 + 50 - 1 and 100 + 50 - 2
    assert _validate(148, 148) == {"target.n_positions"}
    assert _validate(149, 147) == {"draft.n_positions"}


def test_validate_adds_k_for_transformers_neuronx_s_own_loop():
    """Its loop scores a full window from a slot that may reach sequence_length - 1, and refills the draft
    at the window's last slot after a full acceptance: both need P+N+k-1 (speculation.py at 1ade6d7)."""
    assert _validate(154, 154, engine="library") == set()  # 100 + 50 + 5 - 1
    assert _validate(153, 154, engine="library") == {"target.n_positions"}
    assert _validate(154, 153, engine="library") == {"draft.n_positions"}


@pytest.mark.parametrize("engine", ["native", "library", "fused"])
@pytest.mark.parametrize("k", [2, 5, 9])
def test_the_largest_admitted_request_fills_the_cache_exactly(engine, k):
    """What the server admits (max_new_tokens_within with the engine's extra slots) is what the engine's
    own rule needs: one token more would not fit."""
    n, prompt_len = 128, 10
    room = max_new_tokens_within(n, prompt_len, extra_target_slots(engine, k))
    assert target_slots(prompt_len, room, engine, k) == n
    assert draft_slots(prompt_len, room, engine, k) <= n
