"""Pipeline.generate_ids, the server's entry point: per-request sampling, origins, cancel, library engine."""

from __future__ import annotations

import itertools

import pytest
import torch
from conftest import backend, tiny_llama

from neuron_ssp.config import SamplingConfig, load_config
from neuron_ssp.engines.base import GenerationResult
from neuron_ssp.engines.native import plain_generate
from neuron_ssp.errors import UsageError
from neuron_ssp.pipeline.build import Shared, build_drafter, build_generator, share
from neuron_ssp.pipeline.pipeline import Pipeline
from neuron_ssp.speculation.call_cost import WidthCost
from neuron_ssp.speculation.stats import GenerationStats

PROMPT = torch.tensor([1, 5, 7, 9, 5, 7, 11, 13, 5, 7])


def tiny_pipeline(**overrides) -> Pipeline:
    config = load_config(None, {"speculation.policy": "fixed", "speculation.k": 4, **overrides})
    target = backend(tiny_llama(0))
    shared = share(config, target, None)
    return Pipeline(config, None, target, None, build_generator(config, target, None, shared), set(), shared)


def test_the_configs_sampling_uses_the_loaded_generator_and_others_get_their_own():
    pipeline = tiny_pipeline()
    greedy = pipeline.generate_ids(PROMPT, 20)
    assert greedy.tokens == pipeline.generator.generate(PROMPT, 20).tokens
    hot = SamplingConfig(temperature=1.5, seed=7)
    first, second = (pipeline.generate_ids(PROMPT, 20, hot).tokens for _ in range(2))
    assert first == second != greedy.tokens  # reseeded per request; differs from greedy
    assert pipeline.generator.sampling == pipeline.config.sampling  # the loaded generator is untouched


def test_the_generators_own_requests_are_built_as_the_servers_are():
    """`generate` (the CLI's tools set the generator's sampling per sample) builds each request with the one
    builder the server's requests use: a temperature set on the generator is honoured, not only its seed."""
    pipeline = tiny_pipeline(**{"speculation.drafter": "suffix"})
    hot = SamplingConfig(temperature=1.5, seed=7)
    pipeline.generator.sampling = hot
    assert pipeline.generator.generate(PROMPT, 20).tokens == pipeline.generate_ids(PROMPT, 20, hot).tokens
    assert pipeline.generator.generate(PROMPT, 20).tokens != pipeline.generate_ids(PROMPT, 20).tokens


def test_a_request_with_its_own_sampling_drafts_from_the_shared_suffix_history():
    """A request sending temperature/seed must feed and use the one history, not a fresh empty one."""
    pipeline = tiny_pipeline(**{"speculation.drafter": "suffix"})
    history = pipeline.shared.drafter.history
    pipeline.generate_ids(PROMPT, 20, SamplingConfig(temperature=0.8, seed=1))
    assert history.stored_tokens == len(PROMPT) + 20  # the request's prompt and output joined the history
    before = history.stored_tokens
    pipeline.generate_ids(PROMPT, 20, SamplingConfig(seed=5))
    assert history.stored_tokens > before


def test_every_request_learns_into_the_pipelines_one_set_of_counts():
    """With per-position noise a window cannot change a sampled output, so sampled requests learn too."""
    pipeline = tiny_pipeline(**{"speculation.policy": "cost", "speculation.k": 4})
    counts = pipeline.shared.acceptance
    pipeline.generate_ids(PROMPT, 20, SamplingConfig(temperature=0.9, seed=1))
    judged = sum(counts.judged.values())
    assert judged > 0
    pipeline.generate_ids(PROMPT, 20)
    assert sum(counts.judged.values()) > judged
    assert pipeline.generator.policy.acceptance is counts  # the loaded generator learns into the same counts


def test_a_sampled_requests_seed_reproduces_it_whatever_earlier_requests_taught_the_cost_policy():
    """Which drafted tokens the cost policy keeps no longer decides which random numbers are drawn: a seeded
    request gives plain sampling's tokens whatever the counts say."""
    cheap_wide_calls = WidthCost({1: 1.0, 2: 1.05, 3: 1.1, 4: 1.15})  # not this machine's timing: deterministic
    config = load_config(
        None, {"speculation.policy": "cost", "speculation.k": 4, "speculation.drafter": "model", "draft.path": "tiny"}
    )  # a draft model proposes at every step
    target, draft = backend(tiny_llama(0)), backend(tiny_llama(1))
    shared = Shared(cheap_wide_calls, build_drafter(config, target, draft, torch.Generator()))
    pipeline = Pipeline(config, None, target, draft, build_generator(config, target, draft, shared), set(), shared)
    hot = SamplingConfig(temperature=1.0, seed=7)
    first = pipeline.generate_ids(PROMPT, 24, hot)
    assert first.stats.draft_tokens > 0
    for cell in itertools.product(range(3), repeat=3):  # every cell: no drafted token ever accepted
        shared.acceptance.judged[cell], shared.acceptance.accepted[cell] = 1e6, 0.0
    again = pipeline.generate_ids(PROMPT, 24, hot)
    assert again.stats.draft_tokens < first.stats.draft_tokens  # the windows changed...
    assert again.tokens == first.tokens == plain_generate(target, PROMPT, 24, hot).tokens  # ...the text did not


def test_a_fresh_seed_per_sampled_request_without_one_and_the_config_seed_for_greedy():
    pipeline = tiny_pipeline()
    drawn = [pipeline.request_sampling(temperature=1.5) for _ in range(2)]
    assert drawn[0].seed != drawn[1].seed
    texts = [pipeline.generate_ids(PROMPT, 24, s).tokens for s in drawn]
    assert texts[0] != texts[1]
    assert pipeline.generate_ids(PROMPT, 24, drawn[0]).tokens == texts[0]  # the reported seed reproduces it
    assert pipeline.request_sampling(temperature=1.5, seed=3).seed == 3
    assert pipeline.request_sampling() == pipeline.config.sampling  # greedy: nothing to draw


class LoadedFused:
    """Stands for a loaded FusedSpeculativeDecoder: it must never be rebuilt per request."""

    def generate(self, prompt_ids, max_new_tokens, eos_token_ids=(), on_tokens=None):
        if on_tokens:
            on_tokens([3, 4])
        return GenerationResult([3, 4], GenerationStats())

    def row_loop(self):
        return self  # the pipeline asks its loop to `run` one request

    def run(self, request):
        return self.generate(request.prompt_ids, request.max_new_tokens)


def test_the_fused_engine_refuses_sampling_it_cannot_change_per_request_instead_of_rebuilding():
    config = load_config(None, {"speculation.engine": "fused"})
    pipeline = Pipeline(config, None, backend(tiny_llama(0)), None, LoadedFused(), set(), Shared())
    with pytest.raises(UsageError) as refused:
        pipeline.generate_ids(PROMPT, 2, SamplingConfig(temperature=0.7, top_k=5))
    assert [p.field for p in refused.value.problems] == ["temperature", "top_k"]
    assert "engine: native" in str(refused.value)
    with pytest.raises(UsageError):
        pipeline.request_sampling(top_p=0.5)
    assert pipeline.request_sampling(seed=9).seed == 9  # greedy on device: a seed changes nothing
    assert pipeline.generate_ids(PROMPT, 2, SamplingConfig(seed=9)).tokens == [3, 4]  # the loaded engine ran


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_per_request_rng_draws_on_the_device_of_the_logits():
    config = load_config(None, {"speculation.policy": "fixed", "speculation.k": 4, "platform.device": "cuda"})
    target = backend(tiny_llama(0).to("cuda"))
    shared = share(config, target, None)
    pipeline = Pipeline(config, None, target, None, build_generator(config, target, None, shared), set(), shared)
    sampled = pipeline.generate_ids(PROMPT, 12, SamplingConfig(temperature=0.9, seed=2))
    assert len(sampled.tokens) == 12


def test_on_logits_reports_the_target_rows_that_chose_each_committed_token():
    pipeline = tiny_pipeline()
    rows: list[torch.Tensor] = []
    tokens: list[int] = []
    pipeline.generate_ids(PROMPT, 15, on_logits=rows.append, on_commit=lambda t, a, d: tokens.extend(t))
    logits = torch.cat(rows)
    assert logits.shape[0] == len(tokens) == 15
    assert logits.argmax(-1).tolist() == tokens  # greedy: each token is its row's argmax
    plain = tiny_llama(0)(torch.cat([PROMPT, torch.tensor(tokens)]).view(1, -1)).logits[0]
    expected = plain[len(PROMPT) - 1 : len(PROMPT) - 1 + len(tokens)]
    assert torch.allclose(logits, expected, atol=1e-4)


def test_origins_and_cancel_reach_the_caller():
    pipeline = tiny_pipeline()
    steps: list[tuple[list[int], int | None, int]] = []
    result = pipeline.generate_ids(
        PROMPT, 30, on_commit=lambda t, a, d: steps.append((t, a, d)), should_stop=lambda: len(steps) >= 3
    )
    assert len(steps) == 3 and [t for s in steps for t in s[0]] == result.tokens


@pytest.mark.parametrize("policy", ["fixed", "cost"])
def test_drafter_none_is_plain_decoding_through_the_same_loop(policy):
    pipeline = tiny_pipeline(**{"speculation.drafter": "none", "speculation.policy": policy})
    hot = SamplingConfig(temperature=0.9, seed=3)
    for sampling in (SamplingConfig(), hot):
        result = pipeline.generate_ids(PROMPT, 16, sampling)
        assert result.tokens == plain_generate(pipeline.target, PROMPT, 16, sampling).tokens
        assert result.stats.draft_tokens == 0 and result.stats.target_calls == 15
    assert (
        pipeline.generator.generate(PROMPT, 16).tokens
        == plain_generate(pipeline.target, PROMPT, 16, pipeline.config.sampling).tokens
    )


def test_a_seed_reproduces_its_text_while_the_suffix_history_grows():
    """The suffix drafter drafts differently once earlier requests fed its history; the text stays the same."""
    pipeline = tiny_pipeline(**{"speculation.drafter": "suffix"})
    hot = SamplingConfig(temperature=1.0, seed=21)
    first = pipeline.generate_ids(PROMPT, 24, hot)
    for seed in range(3):  # other requests teach the history
        pipeline.generate_ids(PROMPT, 24, SamplingConfig(temperature=1.0, seed=seed))
    again = pipeline.generate_ids(PROMPT, 24, hot)
    assert again.stats.draft_tokens != first.stats.draft_tokens  # the drafts changed...
    assert again.tokens == first.tokens == plain_generate(pipeline.target, PROMPT, 24, hot).tokens  # ...the text not
