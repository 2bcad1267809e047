"""Losslessness on the real NxDI code (CPU mode): speculative sampling through NxDI's speculation model draws
from exactly the target's distribution, as the chi-square tests of tests/test_lossless.py show for our loop.

A tiny NxDI target and a different tiny NxDI draft, k = 2 (one drafted token, a 2-wide window), temperature
0.7 with top-k 6 so the outcome space is small: token 1 comes from the prompt's logits, token 2 from the
acceptor (the draft's token kept, or the residual resampled). The exact distribution of (token 1, token 2) is
computed from the target's own logits through NxDI; SAMPLES generations are compared with it by chi-square
(marginal of token 2 and the joint pair, Bonferroni at ALPHA / 2). Seeds are fixed: deterministic in CI.
A lossy acceptor (typical acceptance) must fail the same test, which shows its power.

Runs in .venv-nxdi (`bash .ci/nxdi.sh`); skips elsewhere with the reason (tests/nxdi_fixtures.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from lossless_support import chi_square_p_value
from neuron_support import VOCAB, prompt
from nxdi_support.configs import nxdi_config

from neuron_ssp.config import SamplingConfig
from neuron_ssp.drafters import ModelDrafter
from neuron_ssp.engines.native import SpeculativeGenerator
from neuron_ssp.speculation.acceptors import ProbabilisticAcceptor, TypicalAcceptor
from neuron_ssp.speculation.policies import FixedPolicy
from neuron_ssp.speculation.sampling import SamplingParams, logits_to_probs
from neuron_ssp.topology import plan_deployment

pytest_plugins = ["neuron_fixtures", "nxdi_fixtures"]  # tiny_model_dirs; nxdi

ALPHA = 1e-3
K = 2
SAMPLES = 1000
SAMPLING = SamplingConfig(temperature=0.7, top_k=6)
PARAMS = SamplingParams(SAMPLING.temperature, SAMPLING.top_k, SAMPLING.top_p)


def load(tiny_model_dirs: dict[str, Path]) -> tuple[Any, Any]:
    from neuron_ssp.backends.nxdi.load import load_nxdi_backends

    config = nxdi_config(
        tiny_model_dirs["target"], tiny_model_dirs["draft"], speculation={"k": K}, neuron={"self_test": False}
    )
    return load_nxdi_backends(config, plan_deployment(config))


def exact_pairs(target: Any, ids: torch.Tensor) -> torch.Tensor:
    """P(token 1, token 2) as a (V, V) tensor, from the target's logits through NxDI."""
    first = logits_to_probs(target.prefill(ids), PARAMS).double()
    pairs = torch.zeros(VOCAB, VOCAB, dtype=torch.float64)
    for token in first.nonzero().flatten().tolist():
        second = logits_to_probs(target.prefill(torch.cat([ids, torch.tensor([token])])), PARAMS).double()
        pairs[token] = first[token] * second
    return pairs


def sampled_pairs(target: Any, draft: Any, ids: torch.Tensor, acceptor_cls: type) -> tuple[torch.Tensor, float]:
    rng = torch.Generator()
    generator = SpeculativeGenerator(
        target, ModelDrafter(draft, PARAMS, rng), acceptor_cls(PARAMS, rng), FixedPolicy(K), SAMPLING, K, rng
    )
    rows, accepted, drafted = [], 0, 0
    for seed in range(SAMPLES):
        generator.sampling = SAMPLING.model_copy(update={"seed": seed})
        result = generator.generate(ids, 3)  # token 1 from the prompt, then one window: tokens 2 (and 3)
        rows.append(result.tokens[:2])
        accepted, drafted = accepted + result.stats.accepted_tokens, drafted + result.stats.draft_tokens
    return torch.tensor(rows), accepted / drafted


def p_values(target: Any, draft: Any, acceptor_cls: type) -> tuple[dict[str, float], float]:
    ids = prompt(6)
    exact = exact_pairs(target, ids)
    tokens, acceptance = sampled_pairs(target, draft, ids, acceptor_cls)
    second = torch.bincount(tokens[:, 1], minlength=VOCAB).double()
    pair = torch.bincount(tokens[:, 0] * VOCAB + tokens[:, 1], minlength=VOCAB * VOCAB).double()
    return {
        "token 2": chi_square_p_value(second, exact.sum(0)),
        "tokens 1,2": chi_square_p_value(pair, exact.flatten()),
    }, acceptance


def test_speculative_sampling_on_nxdi_follows_the_target_distribution(
    nxdi: Any, tiny_model_dirs: dict[str, Path]
) -> None:
    target, draft = load(tiny_model_dirs)
    found, acceptance = p_values(target, draft, ProbabilisticAcceptor)
    assert 0.02 < acceptance < 0.98, f"draft and target should partly agree, acceptance {acceptance:.2f}"
    failing = {name: p for name, p in found.items() if p <= ALPHA / len(found)}
    assert not failing, f"SSp on NxDI differs from the target at {failing}"


def test_the_test_catches_a_lossy_acceptor_on_nxdi(nxdi: Any, tiny_model_dirs: dict[str, Path]) -> None:
    target, draft = load(tiny_model_dirs)
    found, _ = p_values(target, draft, TypicalAcceptor)
    assert min(found.values()) <= ALPHA / len(found), found
