"""The stand-in transformers_neuronx keeps the real library's signatures, shapes and refusals."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
from pathlib import Path
from types import ModuleType

import pytest
import torch
from neuron_support import STANDIN, VOCAB

from neuron_ssp.speculation.acceptors import neuron_base_class

SIGNATURES = json.loads((STANDIN / "neuronx_signatures.json").read_text())
HOME = {
    "LlamaForSampling": "transformers_neuronx.llama.model",
    "NeuronModelBase": "transformers_neuronx.base",
    "PretrainedModel": "transformers_neuronx.module",
    "TokenAcceptor": "transformers_neuronx.speculation",
    "DefaultTokenAcceptor": "transformers_neuronx.speculation",
    "DraftProvider": "transformers_neuronx.speculation",
    "DraftModelForSpeculation": "transformers_neuronx.speculation",
    "SpeculativeGenerator": "transformers_neuronx.speculation",
    "FusedSpeculativeDecoder": "transformers_neuronx.fused_speculation",
    "NeuronConfig": "transformers_neuronx.config",
    "GenerationConfig": "transformers_neuronx.config",
    "ContinuousBatchingConfig": "transformers_neuronx.config",
}

pytest_plugins = ["neuron_fixtures"]  # fixtures: neuronx, neuronx_any, neuronx_commit, tiny_model_dirs


def _as_json(func: object) -> list[dict[str, object]]:
    params = []
    for p in inspect.signature(func).parameters.values():
        entry: dict[str, object] = {"name": p.name, "kind": p.kind.name.lower()}
        if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            entry["default"] = None if p.default is p.empty else repr(p.default)
        params.append(entry)
    return params


def _function(qualified: str) -> object:
    class_name, method = qualified.split(".")
    cls = getattr(importlib.import_module(HOME[class_name]), class_name)
    attribute = inspect.getattr_static(cls, method)
    return attribute.__func__ if isinstance(attribute, classmethod) else attribute


def test_the_package_never_sees_the_standin_without_the_fixture() -> None:
    assert importlib.util.find_spec("transformers_neuronx") is None


SIGNATURE_SETS = {"7a30b42": ["sdk_2_18"], "0623de2": ["0623de2"], "c8d6bdc": ["c8d6bdc"], "1ade6d7": ["sdk_2_21"]}


def test_signatures_match_the_real_library(neuronx_commit: ModuleType) -> None:
    expected = {
        name: params for key in SIGNATURE_SETS[neuronx_commit.COMMIT] for name, params in SIGNATURES[key].items()
    }
    if neuronx_commit.COMMIT == "1ade6d7":
        expected.update(SIGNATURES["sdk_2_21_fused"])
    for qualified, params in expected.items():
        normalised = [
            {**p, "default": p.get("default")}
            if p["kind"] not in ("var_positional", "var_keyword")
            else {"name": p["name"], "kind": p["kind"]}
            for p in params
        ]
        assert _as_json(_function(qualified)) == normalised, qualified


def test_the_copy_of_the_signatures_matches_shared() -> None:
    """Ours holds everything shared/ holds, unchanged; it adds the fused decoder's classes (1ade6d74)."""
    shared = Path(__file__).resolve().parents[2] / "shared" / "neuronx_signatures.json"
    if not shared.is_file():
        pytest.skip("no shared/ beside the repository")
    for key, value in json.loads(shared.read_text()).items():
        if isinstance(value, dict):
            assert {name: SIGNATURES[key][name] for name in value} == value, key
        else:
            assert SIGNATURES[key] == value, key


def test_the_older_generation_has_no_fused_decoder(neuronx_any: ModuleType) -> None:
    found = importlib.util.find_spec("transformers_neuronx.fused_speculation") is not None
    if neuronx_any.API == "sdk_2_21":
        assert found
        return
    with pytest.raises(ImportError):
        importlib.import_module("transformers_neuronx.fused_speculation")


def test_output_shapes(neuronx: ModuleType, tiny_model_dirs: dict[str, Path]) -> None:
    from transformers_neuronx import LlamaForSampling

    model = LlamaForSampling.from_pretrained(str(tiny_model_dirs["target"]), n_positions=64, tp_degree=2)
    model.enable_speculative_decoder(4)
    model.to_neuron()
    context = model.forward(torch.tensor([[5, 6, 7]]))
    assert context.shape == (1, VOCAB) and context.dtype == torch.float32
    window = model.speculative_forward(
        torch.tensor([[8, 9, 10, 11]]), cache_ids=torch.arange(3, 7), speculation_length=4
    )
    assert window.shape == (4, VOCAB, 1)
    assert torch.equal(window[0, :, 0], model.forward(torch.tensor([[8]]), cache_ids=torch.tensor([3]))[0])


def test_refuses_a_partial_core_overlap_like_the_runtime(neuronx: ModuleType, tiny_model_dirs: dict[str, Path]) -> None:
    from transformers_neuronx import LlamaForSampling

    LlamaForSampling.from_pretrained(str(tiny_model_dirs["target"]), tp_degree=2).to_neuron()
    LlamaForSampling.from_pretrained(str(tiny_model_dirs["draft"]), tp_degree=2).to_neuron()  # same cores
    with pytest.raises(RuntimeError, match="partially overlap"):
        LlamaForSampling.from_pretrained(str(tiny_model_dirs["draft"]), tp_degree=4).to_neuron()


def test_refuses_what_the_device_would_get_wrong(neuronx: ModuleType, tiny_model_dirs: dict[str, Path]) -> None:
    from transformers_neuronx import LlamaForSampling

    model = LlamaForSampling.from_pretrained(str(tiny_model_dirs["target"]), n_positions=64, tp_degree=2)
    with pytest.raises(RuntimeError, match="to_neuron"):
        model.forward(torch.tensor([[5]]))
    model.to_neuron()
    with pytest.raises(RuntimeError, match="before to_neuron"):
        model.enable_speculative_decoder(4)
    with pytest.raises(KeyError):
        model.speculative_forward(torch.tensor([[1, 2]]), speculation_length=2)
    with pytest.raises(RuntimeError, match="never written"):
        model.forward(torch.tensor([[5]]), cache_ids=torch.tensor([3]))


def test_neuron_base_class_is_the_library_token_acceptor_when_it_imports(neuronx: ModuleType) -> None:
    from transformers_neuronx.speculation import TokenAcceptor

    assert neuron_base_class() is TokenAcceptor


def test_neuron_base_class_is_object_without_the_library() -> None:
    assert neuron_base_class() is object
