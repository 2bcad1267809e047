"""The torch reference backend: sliding-window caches (a rejected draft is rolled back by cropping, and a
window-sized cache has already dropped what a crop must restore) and logits kept on the model's device
(no device-to-host copy per call)."""

from __future__ import annotations

import copy

import pytest
import torch
import transformers
from conftest import backend, tiny_llama
from transformers import MistralConfig, MistralForCausalLM

from neuron_ssp.backends.base import SingleSlot
from neuron_ssp.backends.torch.scoring import TorchBackend
from neuron_ssp.config import SamplingConfig
from neuron_ssp.drafters import ModelDrafter
from neuron_ssp.engines.base import sampling_params
from neuron_ssp.engines.native import SpeculativeGenerator, plain_generate
from neuron_ssp.errors import UsageError
from neuron_ssp.speculation.acceptors import build_acceptor
from neuron_ssp.speculation.policies import FixedPolicy

PROMPT = torch.tensor([1, 5, 7, 9, 5, 7, 11, 13, 5, 7])
GREEDY = SamplingConfig(temperature=0.0)
WINDOW = 6


def tiny_sliding(seed: int, noise: float = 0.0) -> MistralForCausalLM:
    """A Llama-shaped model whose every layer attends to the last WINDOW tokens only."""
    torch.manual_seed(0)
    config = MistralConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                           sliding_window=WINDOW)
    model = MistralForCausalLM(config).eval()
    if noise:
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for param in model.parameters():
                param.add_(torch.randn(param.shape, generator=gen) * noise * param.abs().mean())
    return model


def speculative(target, draft, k: int, sampling: SamplingConfig = GREEDY) -> SpeculativeGenerator:
    rng = torch.Generator(device=getattr(target, "device", "cpu"))
    params = sampling_params(sampling)
    return SpeculativeGenerator(target, ModelDrafter(draft, params, rng), build_acceptor("probabilistic", params, rng),
                                FixedPolicy(k), sampling, k, rng)


@pytest.mark.parametrize("k", [2, 4, 7])
def test_sliding_window_models_roll_back_rejected_drafts(k):
    target_model = tiny_sliding(0)
    draft_model = tiny_sliding(1, noise=0.2)
    assert any(getattr(layer, "is_sliding", False) for layer in getattr(backend(target_model)._forward._new_cache(),
                                                                          "layers", [])) or not hasattr(
        transformers.cache_utils, "DynamicSlidingWindowLayer")
    plain = plain_generate(backend(target_model), PROMPT, 40, GREEDY).tokens
    hf = target_model.generate(PROMPT.view(1, -1), max_new_tokens=40, do_sample=False, min_new_tokens=40,
                               pad_token_id=0)[0, len(PROMPT):].tolist()
    assert plain == hf  # our backend decodes the sliding-window model as Hugging Face does
    result = speculative(backend(target_model), backend(draft_model), k).generate(PROMPT, 40)
    assert result.tokens == plain
    assert 0 < result.stats.acceptance_rate < 1  # rejections past the window: the case that used to fail


def test_a_cache_that_cannot_roll_back_is_refused_up_front(monkeypatch):
    cache_base = transformers.cache_utils.Cache
    if not hasattr(cache_base, "activate_past_recording"):
        pytest.skip("this transformers has no sliding-window cache layers")
    monkeypatch.delattr(cache_base, "activate_past_recording")
    with pytest.raises(UsageError) as err:
        TorchBackend(tiny_sliding(0), 512, name="target")
    problem = err.value.problems[0]
    assert problem.field == "target.path" and "DynamicSlidingWindowLayer" in str(problem.value)
    assert "sliding window" in problem.rule and "full attention" in problem.fix


def test_full_attention_models_need_no_recording():
    assert TorchBackend(tiny_llama(0), 512, forward="hf")._forward._recording is False


class HostLogits(SingleSlot):
    """The old behaviour, as a reference: the same backend with logits copied to the host."""

    def __init__(self, inner: TorchBackend):
        self.inner = inner
        self.name, self.vocab_size, self.n_positions = inner.name, inner.vocab_size, inner.n_positions
        self.max_score_width = None

    def prefill(self, prompt_ids):
        return self.inner.prefill(prompt_ids).cpu()

    def score(self, token_ids, start):
        return self.inner.score(token_ids, start).cpu()


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_results_are_unchanged_on_cpu(temperature):
    sampling = SamplingConfig(temperature=temperature, seed=4)
    target, draft = tiny_llama(0), tiny_llama(1, layers=1)
    ours = speculative(backend(target), backend(draft), 4, sampling).generate(PROMPT, 30).tokens
    reference = speculative(HostLogits(backend(target)), HostLogits(backend(draft)), 4, sampling)
    assert ours == reference.generate(PROMPT, 30).tokens
    assert plain_generate(backend(target), PROMPT, 30, sampling).tokens == \
        plain_generate(HostLogits(backend(target)), PROMPT, 30, sampling).tokens


def test_the_backend_never_copies_logits_to_the_host(monkeypatch):
    """On CUDA `.cpu()` is a (n, vocab) device-to-host copy per call; only token ids may cross."""
    target, draft = backend(tiny_llama(0)), backend(tiny_llama(1, layers=1))
    gen = speculative(target, draft, 4, SamplingConfig(temperature=1.0))

    def refuse(self, *args, **kwargs):
        raise AssertionError("logits copied to the host")

    monkeypatch.setattr(torch.Tensor, "cpu", refuse)
    assert len(gen.generate(PROMPT, 20).tokens) == 20


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_logits_stay_on_the_device_and_output_matches_plain():
    device = torch.device("cuda")
    target_model = copy.deepcopy(tiny_llama(0)).to(device)
    draft_model = copy.deepcopy(tiny_llama(1, layers=1)).to(device)
    target = TorchBackend(target_model, 512)
    assert target.prefill(PROMPT).device.type == "cuda"
    plain = plain_generate(TorchBackend(target_model, 512), PROMPT, 40, GREEDY).tokens
    assert speculative(target, TorchBackend(draft_model, 512), 4).generate(PROMPT, 40).tokens == plain
    sampled = speculative(target, TorchBackend(draft_model, 512), 4, SamplingConfig(temperature=1.0, seed=2))
    assert len(sampled.generate(PROMPT, 40).tokens) == 40
