"""Pipeline.generate_ids, the server's entry point: per-request sampling, origins, cancel, library engine."""

from __future__ import annotations

import torch
from conftest import backend, tiny_llama

from neuron_ssp.config import SamplingConfig, load_config
from neuron_ssp.engines.native import GenerationResult, sampling_params
from neuron_ssp.pipeline.build import build_generator
from neuron_ssp.pipeline.pipeline import Pipeline
from neuron_ssp.speculation.acceptors import build_acceptor
from neuron_ssp.speculation.stats import GenerationStats

PROMPT = torch.tensor([1, 5, 7, 9, 5, 7, 11, 13, 5, 7])


def tiny_pipeline() -> Pipeline:
    config = load_config(None, {"speculation.policy": "fixed", "speculation.k": 4})
    target = backend(tiny_llama(0))
    rng = torch.Generator()
    acceptor = build_acceptor(config.speculation.acceptor, sampling_params(config.sampling), rng)
    return Pipeline(config, None, target, None, build_generator(config, target, None, acceptor, rng), set())


def test_the_configs_sampling_uses_the_loaded_generator_and_others_get_their_own():
    pipeline = tiny_pipeline()
    greedy = pipeline.generate_ids(PROMPT, 20)
    assert greedy.tokens == pipeline.generator.generate(PROMPT, 20).tokens
    hot = SamplingConfig(temperature=1.5, seed=7)
    first, second = (pipeline.generate_ids(PROMPT, 20, hot).tokens for _ in range(2))
    assert first == second != greedy.tokens  # reseeded per request; differs from greedy
    assert pipeline.generator.sampling == pipeline.config.sampling  # the loaded generator is untouched


def test_origins_and_cancel_reach_the_caller():
    pipeline = tiny_pipeline()
    steps: list[tuple[list[int], int | None, int]] = []
    result = pipeline.generate_ids(PROMPT, 30, on_commit=lambda t, a, d: steps.append((t, a, d)),
                                   should_stop=lambda: len(steps) >= 3)
    assert len(steps) == 3 and [t for s in steps for t in s[0]] == result.tokens


class OneShotEngine:
    """Like the library engine: no hooks, all tokens at the end."""

    def generate(self, prompt_ids, max_new_tokens, eos_token_ids=(), on_tokens=None):
        tokens = [3, 4, 5][:max_new_tokens]
        if on_tokens:
            on_tokens(tokens)
        return GenerationResult(tokens, GenerationStats())


def test_an_engine_without_hooks_reports_origin_unknown():
    pipeline = tiny_pipeline()
    pipeline.generator = OneShotEngine()
    steps: list[tuple[list[int], int | None, int]] = []
    pipeline.generate_ids(PROMPT, 3, on_commit=lambda t, a, d: steps.append((t, a, d)), should_stop=lambda: True)
    assert steps == [([3, 4, 5], None, 0)]
