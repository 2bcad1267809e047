"""The torch reference backend: sliding-window caches (a rejected draft is rolled back by cropping, and a
window-sized cache has already dropped what a crop must restore) and logits kept on the model's device
(no device-to-host copy per call)."""

from __future__ import annotations

import copy

import numpy
import pytest
import torch
import torch.utils._pytree as pytree
import transformers
from conftest import TINY_VOCAB, backend, tiny_llama
from torch.overrides import TorchFunctionMode
from transformers import MistralConfig, MistralForCausalLM

from neuron_ssp.backends.base import SingleSlot
from neuron_ssp.backends.torch import hf_forward
from neuron_ssp.backends.torch.hf_forward import TRANSFORMERS_5
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
    config = MistralConfig(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        sliding_window=WINDOW,
    )
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
    return SpeculativeGenerator(
        target,
        ModelDrafter(draft, params, rng),
        build_acceptor("probabilistic", params, rng),
        FixedPolicy(k),
        sampling,
        k,
        rng,
    )


@pytest.mark.parametrize("k", [2, 4, 7])
def test_sliding_window_models_roll_back_rejected_drafts(k):
    target_model = tiny_sliding(0)
    draft_model = tiny_sliding(1, noise=0.2)
    layers = getattr(backend(target_model)._forward._new_cache(), "layers", [])
    # window-sized layers where this transformers rolls them back (5.18+), full-length ones before
    assert any(getattr(layer, "is_sliding", False) for layer in layers) == hf_forward.SLIDING_LAYERS_ROLL_BACK
    plain = plain_generate(backend(target_model), PROMPT, 40, GREEDY).tokens
    hf = target_model.generate(
        PROMPT.view(1, -1), max_new_tokens=40, do_sample=False, min_new_tokens=40, pad_token_id=0
    )[0, len(PROMPT) :].tolist()
    assert plain == hf  # our backend decodes the sliding-window model as Hugging Face does
    result = speculative(backend(target_model), backend(draft_model), k).generate(PROMPT, 40)
    assert result.tokens == plain
    assert 0 < result.stats.acceptance_rate < 1  # rejections past the window: the case that used to fail


@pytest.mark.skipif(not TRANSFORMERS_5, reason="transformers 5.x only: 4.x caches keep every state")
@pytest.mark.parametrize("k", [2, 7])
def test_full_length_layers_stand_in_for_sliding_ones_that_cannot_roll_back(monkeypatch, k):
    """What transformers 4.56-5.17 get (their sliding layers cannot be rolled back under the mask), run
    on this one: full-length layers, the mask applying the window, the same tokens as Hugging Face's."""
    monkeypatch.setattr(hf_forward, "SLIDING_LAYERS_ROLL_BACK", False)
    target_model, draft_model = tiny_sliding(0), tiny_sliding(1, noise=0.2)
    target = backend(target_model)
    layers = target._forward._new_cache().layers
    assert layers and not any(getattr(layer, "is_sliding", False) for layer in layers)
    assert target._forward._recording is False
    hf = target_model.generate(
        PROMPT.view(1, -1), max_new_tokens=40, do_sample=False, min_new_tokens=40, pad_token_id=0
    )[0, len(PROMPT) :].tolist()
    assert plain_generate(target, PROMPT, 40, GREEDY).tokens == hf  # the window still applies
    result = speculative(target, backend(draft_model), k).generate(PROMPT, 40)
    assert result.tokens == hf and 0 < result.stats.acceptance_rate < 1


def test_a_cache_that_cannot_roll_back_is_refused_up_front(monkeypatch):
    cache_base = transformers.cache_utils.Cache
    if not hasattr(cache_base, "activate_past_recording") or not hf_forward.SLIDING_LAYERS_ROLL_BACK:
        pytest.skip("this transformers' sliding-window layers are replaced by full-length ones")
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
    assert (
        plain_generate(backend(target), PROMPT, 30, sampling).tokens
        == plain_generate(HostLogits(backend(target)), PROMPT, 30, sampling).tokens
    )


class LogitsOnDevice(TorchFunctionMode):
    """Follows logits through every torch call and records each time one is read on the host.

    On CUDA the logits live on the GPU, and reading them in Python (`.item()`, `.tolist()`, `float()`, numpy)
    or moving them with `.cpu()` / `.to("cpu")` is a device-to-host copy per call. On a CPU the model's device
    is the host, so no copy can be seen; what can be seen is the code that would copy on a GPU. Logits are the
    float tensors whose last dimension is the vocabulary, and every float tensor computed from one (integer
    and bool results, the token ids and decisions, may cross). Moving one is allowed only to a device read
    off a logits tensor (`.to(p.device)`) or one of `devices` (the backends'), the same device on a GPU;
    any other destination (a name, `torch.device("cpu")`, a tensor of ids) is a crossing."""

    READS = {
        "cpu",
        "item",
        "tolist",
        "numpy",
        "__array__",
        "__float__",
        "__int__",
        "__index__",
        "__bool__",
        "__complex__",
        "__repr__",
        "__format__",
    }

    def __init__(self, vocab_size: int, devices: list[torch.device]):
        super().__init__()
        self.vocab_size = vocab_size
        self.crossings: list[str] = []
        self.logits_seen = 0
        self._tainted: dict[int, torch.Tensor] = {}  # id -> the tensor, held so that no id is reused
        self._device_side: list[torch.device] = list(devices)  # compared by identity: equal values are not enough

    def tainted(self, value: object) -> bool:
        return isinstance(value, torch.Tensor) and id(value) in self._tainted

    def _taint(self, tensor: torch.Tensor) -> None:
        if tensor.is_floating_point() and id(tensor) not in self._tainted:
            self._tainted[id(tensor)] = tensor
            self.logits_seen += 1

    def _on_device(self, destination: object) -> bool:
        if isinstance(destination, torch.Tensor):
            return self.tainted(destination)
        if isinstance(destination, torch.device):
            return destination.type != "cpu" or any(destination is d for d in self._device_side)
        return isinstance(destination, int) or (isinstance(destination, str) and not destination.startswith("cpu"))

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = [x for x in pytree.tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)]
        source = bool(inputs) and self.tainted(args[0]) if args else False
        name = getattr(func, "__name__", "")
        if source and name in self.READS:
            self.crossings.append(f"{name}() of a {tuple(args[0].shape)} {args[0].dtype} from the logits")
        elif source and name == "to":
            destinations = [
                x
                for x in (*args[1:], kwargs.get("device"), kwargs.get("other"))
                if x is not None and not isinstance(x, (torch.dtype, bool))
            ]
            self.crossings += [
                f"to({d!r}) of a {tuple(args[0].shape)} tensor from the logits"
                for d in destinations
                if not self._on_device(d)
            ]
        elif name == "copy_" and self.tainted(args[1]) and not self.tainted(args[0]):
            self.crossings.append(f"copy_ of a {tuple(args[1].shape)} tensor from the logits into another")
        result = func(*args, **kwargs)
        if func == torch.Tensor.device.__get__ and source:
            self._device_side.append(result)
        derived = any(self.tainted(x) for x in inputs)
        for out in pytree.tree_leaves(result):
            if isinstance(out, torch.Tensor) and (derived or (out.dim() and out.shape[-1] == self.vocab_size)):
                self._taint(out)
        if derived and (name.endswith("_") or name == "__setitem__") and isinstance(args[0], torch.Tensor):
            self._taint(args[0])  # written in place from the logits
        return result


@pytest.mark.parametrize("forward", ["compact", "hf"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_logits_never_leave_the_models_device(forward, temperature):
    """scoring.py: logits stay on the model's device, the sampler draws there, only token ids cross."""
    target, draft = (
        TorchBackend(tiny_llama(0), 512, forward=forward),
        TorchBackend(tiny_llama(1, layers=1), 512, forward=forward),
    )
    plain_target = TorchBackend(tiny_llama(0), 512, forward=forward)
    sampling = SamplingConfig(temperature=temperature, seed=3)
    watch = LogitsOnDevice(TINY_VOCAB, [target.device, draft.device, plain_target.device])
    with watch:
        speculated = speculative(target, draft, 4, sampling).generate(PROMPT, 20)
        plain = plain_generate(plain_target, PROMPT, 20, sampling)
    assert watch.logits_seen > 100  # it did follow the logits
    assert watch.crossings == []
    assert len(speculated.tokens) == len(plain.tokens) == 20


def test_the_watch_sees_each_way_of_reading_logits_on_the_host():
    """LogitsOnDevice itself: what a change to the backend or the sampler could do to logits on a GPU."""
    crossings = {
        ".cpu()": lambda x: x.cpu(),
        '.to("cpu")': lambda x: x.to("cpu"),
        '.to(device=torch.device("cpu"))': lambda x: x.to(device=torch.device("cpu")),
        ".to(a tensor of ids)": lambda x: x.to(torch.zeros(1, dtype=torch.long)),
        ".item() of a softmax": lambda x: x.softmax(-1)[0, 3].item(),
        ".tolist() of a row": lambda x: x[0].tolist(),
        "float() of a maximum": lambda x: float(x.max()),
        "numpy": lambda x: numpy.asarray(x.exp()),
        "a copy into another tensor": lambda x: torch.empty(2).copy_(x.amax(-1)),
    }
    allowed = {
        "token ids": lambda x: (int(x.argmax()), x.argmax(-1).tolist(), torch.multinomial(x.softmax(-1), 1).tolist()),
        "a bool": lambda x: bool(x.isfinite().all()),
        "the logits' own device": lambda x: x[:, :5].to(x.softmax(-1).device),
        "a dtype": lambda x: x.to(torch.float64),
    }
    for what, read in {**crossings, **allowed}.items():
        watch = LogitsOnDevice(TINY_VOCAB, [])
        with watch:
            read(torch.randn(2, TINY_VOCAB) + 0.0)
        assert bool(watch.crossings) == (what in crossings), (what, watch.crossings)


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
