"""The model drafter with partial acceptance: a draft that is a perturbed copy of the
target agrees on some positions and not others, so every call crops and refills real KV caches.
Output must equal plain decoding, and after every call each cache must hold exactly what a fresh
forward pass over the tokens it claims to hold would give."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import tiny_llama

from neuron_ssp.backends.torch.scoring import TorchBackend
from neuron_ssp.config import SamplingConfig
from neuron_ssp.drafters import Draft, ModelDrafter
from neuron_ssp.engines.base import sampling_params
from neuron_ssp.engines.native import SpeculativeGenerator, plain_generate
from neuron_ssp.speculation.acceptors import build_acceptor
from neuron_ssp.speculation.policies import FixedPolicy

PROMPT = torch.tensor([1, 5, 7, 9, 5, 7, 11, 13, 5, 7])
GREEDY = SamplingConfig(temperature=0.0)


def perturbed_copy(model, scale: float, seed: int):
    """The target's weights plus relative noise: it agrees with the target often, not always."""
    twin = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in twin.parameters():
            param.add_(torch.randn(param.shape, generator=gen) * scale * param.abs().mean())
    return twin


FORWARDS = ["compact", "hf"]  # a preallocated cache whose later slots are ignored; a DynamicCache that is cropped


def cached_keys(torch_backend, length: int) -> list[torch.Tensor]:
    """Keys of slots 0..length-1; a DynamicCache must hold exactly those, a preallocated one at least those."""
    forward = torch_backend._forward
    if torch_backend.forward_name == "compact":
        return [layer[0, :, :length] for layer in forward.keys]
    cache = forward._caches[0]  # slot 0: prefill and score are its
    assert cache.get_seq_length() == length
    if hasattr(cache, "layers"):
        return [layer.keys for layer in cache.layers]
    return list(cache.key_cache)  # transformers 4.4x


def assert_cache_holds(torch_backend, tokens: list[int]) -> None:
    """The backend's cache equals the one a fresh forward over `tokens` builds, slot for slot."""
    fresh = TorchBackend(torch_backend.model, 512, forward=torch_backend.forward_name)
    fresh.prefill(torch.tensor(tokens))
    ours, expected = cached_keys(torch_backend, len(tokens)), cached_keys(fresh, len(tokens))
    for layer, (a, b) in enumerate(zip(ours, expected, strict=True)):
        assert a.shape == b.shape, f"layer {layer}: {tuple(a.shape)} != {tuple(b.shape)}"
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


class CheckedDrafter(ModelDrafter):
    """After every proposal: the draft cache holds exactly the tokens the drafter says it does."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.checks = 0

    def propose(self, sequence: torch.Tensor, max_tokens: int) -> Draft:
        draft = super().propose(sequence, max_tokens)
        assert self._cached[: len(sequence)] == sequence.tolist()
        assert self._cached[len(sequence) :] == draft.tokens[: len(self._cached) - len(sequence)].tolist()
        assert_cache_holds(self.backend, self._cached)
        self.checks += 1
        return draft


def run(k: int, sampling: SamplingConfig, forward: str, new: int = 40):
    target_model = tiny_llama(0)
    target = TorchBackend(target_model, 512, forward=forward)
    draft = TorchBackend(perturbed_copy(target_model, 0.2, seed=3), 512, forward=forward)
    rng = torch.Generator()
    params = sampling_params(sampling)
    drafter = CheckedDrafter(draft, params, rng)
    gen = SpeculativeGenerator(
        target, drafter, build_acceptor("probabilistic", params, rng), FixedPolicy(k), sampling, k, rng
    )
    result = gen.generate(PROMPT, new)
    return result, target, drafter


@pytest.mark.parametrize("forward", FORWARDS)
@pytest.mark.parametrize("k", [2, 3, 5, 8])
def test_partial_acceptance_keeps_greedy_output_and_consistent_caches(k, forward):
    result, target, drafter = run(k, GREEDY, forward)
    plain = TorchBackend(tiny_llama(0), 512, forward=forward)
    assert result.tokens == plain_generate(plain, PROMPT, 40, GREEDY).tokens
    stats = result.stats
    assert 0.1 < stats.acceptance_rate < 0.95, stats.acceptance_rate  # partial: some kept, some rejected
    if k > 2:
        accepted_some = [a for a in stats.accepted_at if a]
        assert accepted_some and stats.accepted_at[0] < stats.proposed_at[0]
    assert drafter.checks == stats.num_drafts > 0
    # the target's cache: every committed token but the last (never scored), nothing stale behind it
    assert_cache_holds(target, PROMPT.tolist() + result.tokens[:-1])


@pytest.mark.parametrize("forward", FORWARDS)
def test_partial_acceptance_when_sampling_is_reproducible_and_consistent(forward):
    sampling = SamplingConfig(temperature=1.0, seed=11)
    first, target, _ = run(4, sampling, forward)
    second, _, _ = run(4, sampling, forward)
    assert first.tokens == second.tokens
    assert 0.0 < first.stats.acceptance_rate < 1.0
    assert_cache_holds(target, PROMPT.tolist() + first.tokens[:-1])
