"""Import NxD Inference (neuronx-distributed-inference, "NxDI") and build its configs from ours, checked.

What we call, at NxDI 0.9.0 (aws-neuron/neuronx-distributed-inference 4bcdc54b):
- `models.config.NeuronConfig(**kwargs)` (config.py:92): unknown keyword arguments are only logged
  (config.py:640), so a misspelt or renamed option would compile the wrong model without a word. We pass an
  allow-list and read every value back from the built object (`check_applied`).
- `models.llama.modeling_llama.LlamaInferenceConfig(neuron_config, load_config=load_pretrained_config(dir))`
  and `NeuronLlamaForCausalLM(model_dir, config)` (modeling_llama.py:261, 1192; utils/hf_adapter.py:36).
- `NeuronConfig(speculation_length=k)` gives the target a speculation model and no token-generation model
  (model_base.py:3058-3066): every decoding call of the target is k wide. The draft has speculation_length 0.
- `enable_fused_speculation=True` with `FusedSpecNeuronConfig(worker_cls, draft_config, draft_model_path)`
  (config.py:1045) puts draft and target in one graph (`engine: fused`, engines/nxdi_fused.py).
- `logical_nc_config` (config.py:570): 2 on trn2 (two physical cores per logical core), 1 on trn1/inf2.
- `enable_bucketing` with `context_encoding_buckets` and `token_generation_buckets` (config.py:186-201): one
  graph per bucket, so a prompt runs the smallest context bucket that holds it (topology/nxdi_graphs.py).
- `is_continuous_batching` and `ctx_batch_size` (config.py:161-164): a fused target over several rows that join
  and leave (`continuous_batching`).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import json
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from neuron_ssp.backends.imports import import_library
from neuron_ssp.backends.resolve import model_config
from neuron_ssp.config import Config, NxdiSettings
from neuron_ssp.errors import Problem, RuntimeProblem
from neuron_ssp.topology.nxdi_graphs import max_context_length, nxdi_context_buckets, nxdi_token_buckets
from neuron_ssp.topology.nxdi_releases import install_advice

SUPPORTED = (
    "neuronx-distributed-inference 0.8.x to 0.10.x (Neuron SDK 2.28 to 2.31; read at 4bcdc54b, 0.9.0, and "
    "cd3abf3, the SDK 2.28 release)"
)
INSTALL = f"{install_advice()}. Without Neuron hardware use platform.backend: torch"
TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
LNC = {"trn2": 2}  # logical NeuronCore config per instance generation; 1 elsewhere


@dataclass(frozen=True)
class NxdiApi:
    """The installed NxDI: its version and the classes we drive."""

    version: str
    config: ModuleType  # neuronx_distributed_inference.models.config
    llama: ModuleType  # neuronx_distributed_inference.models.llama.modeling_llama
    hf_adapter: ModuleType  # neuronx_distributed_inference.utils.hf_adapter
    family: str | None = None  # the instance family it runs on (catalog generation): its messages name its release

    def neuron_config_kwargs(
        self, config: Config, role: str, speculation_length: int, fused: bool = False, lnc: int = 1
    ) -> dict[str, Any]:
        """The allow-list of NeuronConfig arguments for one model; identical for compile and load. Context
        encoding is bucketed (topology/nxdi_graphs.py), and the config's neuron.nxdi settings are passed as given."""
        model = model_config(config, role)
        context, decoding = nxdi_context_buckets(config, model), nxdi_token_buckets(config, model)
        kwargs: dict[str, Any] = {
            "tp_degree": model.tp_degree,
            "batch_size": model.batch_size,
            "seq_len": model.n_positions,
            "max_context_length": max_context_length(config, model),
            "torch_dtype": TORCH_DTYPES[model.dtype],
            "speculation_length": speculation_length,
            "logical_nc_config": lnc,
            **switches(config.neuron.nxdi),
            "enable_bucketing": True,
            "context_encoding_buckets": context,
            "token_generation_buckets": decoding,
        }
        if fused:
            kwargs["enable_fused_speculation"] = True
        return kwargs

    def neuron_config(
        self,
        kwargs: dict[str, Any],
        on_device_sampling: dict[str, Any] | None = None,
        after_build: dict[str, Any] | None = None,
    ) -> Any:
        """NeuronConfig(**kwargs), then the attributes of `after_build` set on it (what NxDI derives at construction
        and its demo overrides afterwards), every value read back."""
        extra = {}
        if on_device_sampling is not None:
            extra["on_device_sampling_config"] = self.config.OnDeviceSamplingConfig(**on_device_sampling)
        built = self.config.NeuronConfig(**kwargs, **extra)
        for name, value in (after_build or {}).items():
            setattr(built, name, value)
        check_applied(built, {**kwargs, **(after_build or {})}, self.version, self.family)
        return built

    def inference_config(self, model_dir: Path, neuron_config: Any) -> Any:
        return self.llama.LlamaInferenceConfig(
            neuron_config, load_config=self.hf_adapter.load_pretrained_config(str(model_dir))
        )

    def application(self, model_dir: Path, inference_config: Any) -> Any:
        return self.llama.NeuronLlamaForCausalLM(str(model_dir), inference_config)

    def fused_spec_config(self, draft_dir: Path, draft_config: Any) -> Any:
        return self.config.FusedSpecNeuronConfig(
            self.llama.NeuronLlamaForCausalLM._model_cls, draft_config=draft_config, draft_model_path=str(draft_dir)
        )

    def config_sha256(self, neuron_config: Any) -> str:
        """A digest of everything NxDI compiles from (its own serialisation, `models.config.to_dict`)."""
        data = self.config.to_dict(neuron_config)
        return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def eagle_head(target: dict[str, Any]) -> dict[str, Any]:
    """The NeuronConfig switches that make a draft an EAGLE head beside a target built from `target` (its
    arguments), besides the target's EAGLE switches and speculation_length, which an EAGLE head keeps for its last
    draft run (inference_demo.py:512-514 at 4bcdc54b).

    The head runs with the target's sequence parallelism, as NxDI's demo builds it (a copy of the target's config,
    inference_demo.py:504-518); the feature guide's head without it is EAGLE-1's recipe. Under sequence parallelism
    the target's taps reach the head sharded by sequence, (B, S/tp, 3H) (model_base.py:1432-1437); a head with it
    gathers them (:1561-1565), a head without it joins its (B, S, H) embeddings to fc's (B, S/tp, H) (:1589-1592),
    a shape error at tp > 1 (tests/test_nxdi_shipped_tp2.py). NxDI turns it off for the decoding graph itself
    (:3093-3094), so it concerns context encoding only.
    With it the head also takes cc_pipeline_tiling_factor 1. Below weight_gather_seq_len_threshold (32768 by
    default, config.py:154) an EAGLE head keeps its embeddings whole (model_base.py:1500-1506), yet with any other
    factor gathers them again (:1554-1559): (B, tp*S, H), the same shape error. That gather is left from a tiled
    reduce-scatter that the docstring at :1495-1497 still describes and the code no longer has. The head's factor
    goes nowhere else for a Llama head: the compiler flag is the wrapper's, from the target's config
    (model_wrapper.py:86-92), and tile_cc (config.py:586-588) only tiles collectives of NKI MLP kernels.
    The feature guide's `trace_tokengen_model` is no NeuronConfig argument in 0.9.0: it is logged as unexpected
    (config.py:639-640) and a deprecated getter answers for it (:771-780), so it is not passed."""
    sequence_parallel = bool(target.get("sequence_parallel_enabled", False))
    head: dict[str, Any] = {"is_eagle_draft": True, "sequence_parallel_enabled": sequence_parallel}
    if sequence_parallel:
        head["cc_pipeline_tiling_factor"] = 1
    return head


# Set on an EAGLE head's NeuronConfig once built, as NxDI's demo sets it on the head's copy of the target's config
# (inference_demo.py:515): `enable_eagle_speculation` turns fused speculation on at construction (config.py:255-256).
# A head is a worker inside the target's fused model, not an application, and for a Llama head the flag is read only
# on paths not built here (sliding windows, prefix caching: model_base.py:370, :768, :797; attention_base.py:243,
# :2300); the wrappers read the target's config.
EAGLE_HEAD_AFTER_BUILD = {"enable_fused_speculation": False}


def switches(settings: NxdiSettings) -> dict[str, Any]:
    """The config's neuron.nxdi switches set away from NxDI's defaults, as NeuronConfig arguments (the buckets are
    passed for every model, defaulted: topology/nxdi_graphs.py)."""
    defaults = NxdiSettings()
    return {name: value for name, value in settings if "buckets" not in name and value != getattr(defaults, name)}


def eagle_switches(drafter: str) -> dict[str, Any]:
    """NeuronConfig switches of an EAGLE target and its head (drafter eagle / eagle3; nothing for a draft model):
    `enable_eagle_speculation` (config.py:246, which turns fused speculation on, :255-256); for EAGLE-3 `is_eagle3`
    (:248) and `enable_eagle_draft_input_norm` (:250): without it the head's decoder layer has no input_layernorm
    and skips both of EAGLE-3's input norms (modeling_llama.py:893-901, :972-982), while an EAGLE-3 head normalises
    the token embedding and the fused hidden state apart (SafeAILab cnets.py; drafters/eagle_head.py)."""
    if drafter == "eagle":
        return {"enable_eagle_speculation": True}
    if drafter == "eagle3":
        return {"enable_eagle_speculation": True, "is_eagle3": True, "enable_eagle_draft_input_norm": True}
    return {}


def continuous_batching(batch_size: int) -> dict[str, Any]:
    """NeuronConfig arguments for fused speculation over `batch_size` rows that join and leave (engines/nxdi_fused.py),
    for draft and target alike: continuous batching with prompts encoded one at a time (`ctx_batch_size=1`), the
    decoding graph at `batch_size` (`tkg_batch_size` defaults to it, config.py:162), as vLLM's NxDI worker set them
    for speculation (`_get_default_speculation_config` at vllm 02f0c7b2; vllm PR #18274: "NxDI only supports
    continuous batching with prefill batch size 1"). The draft gets the target's batch: NxDI runs it at the target's
    context and decoding batch sizes (model_base.py:3081-3083, 3110-3112) but sizes its KV cache by its own
    batch_size (`kv_cache_batch_size`, config.py:166). Nothing at batch 1, so a batch-1 model compiles as before.
    NxDI refuses batch bucketing with speculation (`_validate_batch_bucketing_compatibility`, config.py:645-688):
    fewer rows than the batch run padded to it (model_wrapper.py:574)."""
    if batch_size == 1:
        return {}
    return {"batch_size": batch_size, "is_continuous_batching": True, "ctx_batch_size": 1}


def check_applied(built: Any, kwargs: dict[str, Any], version: str, family: str | None = None) -> None:
    """Every argument we passed must be an attribute of the built NeuronConfig with our value."""
    import torch

    wrong = []
    for name, value in kwargs.items():
        got = getattr(built, name, None)
        expected = getattr(torch, value) if name == "torch_dtype" else value
        if got != expected:
            wrong.append(f"{name} (passed {value!r}, got {got!r})")
    if wrong:
        raise RuntimeProblem(
            Problem(
                "neuronx-distributed-inference",
                version,
                f"NeuronConfig did not take {', '.join(wrong)}; supported: {SUPPORTED}",
                f"install the release of the instance: {install_advice(family)}",
            )
        )


def load_nxdi(family: str | None = None) -> NxdiApi:
    """The installed NxDI, or a RuntimeProblem that says what is missing and how to install it (for `family`,
    the instance family it is to run on, when known)."""
    config, llama, hf_adapter = import_library(
        tuple(
            f"neuronx_distributed_inference.{name}"
            for name in ("models.config", "models.llama.modeling_llama", "utils.hf_adapter")
        ),
        "neuron.library",
        "nxdi",
        "neuronx-distributed-inference",
        INSTALL,
    )
    missing = [
        f"models.config.{name}"
        for name in ("NeuronConfig", "OnDeviceSamplingConfig", "FusedSpecNeuronConfig", "to_dict")
        if not hasattr(config, name)
    ]
    missing += [
        f"modeling_llama.{name}"
        for name in ("NeuronLlamaForCausalLM", "LlamaInferenceConfig")
        if not hasattr(llama, name)
    ]
    app = getattr(llama, "NeuronLlamaForCausalLM", None)
    missing += [
        f"NeuronLlamaForCausalLM.{name}"
        for name in ("compile", "load", "forward")
        if app is not None and not hasattr(app, name)
    ]
    if not hasattr(hf_adapter, "load_pretrained_config"):
        missing.append("utils.hf_adapter.load_pretrained_config")
    version = installed_version()
    if missing:
        raise RuntimeProblem(
            Problem(
                "neuronx-distributed-inference",
                version,
                f"this version lacks {', '.join(missing)}; supported: {SUPPORTED}",
                f"install the release of the instance: {install_advice(family)}",
            )
        )
    return NxdiApi(version, config, llama, hf_adapter, family)


def installed_version() -> str:
    try:
        return importlib.metadata.version("neuronx-distributed-inference")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
