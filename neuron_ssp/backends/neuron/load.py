"""Load the draft and the speculation-enabled target onto NeuronCores through transformers-neuronx.

Order matters on Neuron, so it is spelt out here: validate (a bad placement would otherwise fail
minutes into a load), set `NEURON_RT_VISIBLE_CORES` and the compile cache before the runtime starts,
then per model in the plan's load order: `from_pretrained` with allow-listed arguments,
`enable_speculative_decoder(ks)` on the target, `load(dir)` of compiled artifacts when they match,
and `to_neuron()` last. A target compiled by `neuron-ssp compile --k 2..8` holds every k; the backend
picks the window at run time (`speculative_forward(..., speculation_length=k)`).
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

from neuron_ssp.backends.neuron.api import NeuronxApi, load_neuronx
from neuron_ssp.backends.neuron.artifacts import ArtifactStore, artifact_spec
from neuron_ssp.backends.neuron.env import device_nodes
from neuron_ssp.backends.neuron.scoring import NeuronBackend
from neuron_ssp.backends.neuron.selftest import check_self_test, run_self_test
from neuron_ssp.config import Config, ModelConfig
from neuron_ssp.embedded.models import resolve_model_path
from neuron_ssp.errors import Problem, RuntimeProblem, UsageError
from neuron_ssp.topology import DeploymentPlan, validate_config

VISIBLE_CORES_ENV = "NEURON_RT_VISIBLE_CORES"
COMPILE_CACHE_ENV = "NEURON_COMPILE_CACHE_URL"


def load_neuron_backends(config: Config, plan: DeploymentPlan) -> tuple[Any, Any]:
    """(target, draft) on Neuron; the draft is None unless `speculation.drafter` is 'model'."""
    api = prepare_runtime(config, plan)
    if config.speculation.engine == "fused":
        return load_on_device_backends(api, config, plan)
    store = ArtifactStore(config.neuron.compiled_dir) if config.neuron.compiled_dir else None
    backends: dict[str, NeuronBackend] = {}
    for role in plan.load_order:
        model_cfg = model_config(config, role)
        k = speculation_length(config, role)
        model_dir = resolve_model_path(model_cfg.path, f"{role}.path")
        windows, artifacts = ([k] if k else None), None
        if store is not None:
            spec = artifact_spec(role, model_dir, api.constructor_kwargs(model_cfg), windows, api.version,
                                 one_k_per_model=not api.speculation_takes_k_list)
            if k is None:
                artifacts = store.find(spec)
            elif found := store.find_for_window(spec, k):
                artifacts, windows = found
        model = build_model(api, model_dir, model_cfg, windows, artifacts)
        backends[role] = NeuronBackend(model, role, int(model.config.vocab_size), model_cfg.n_positions, k, windows)
    if config.neuron.self_test:
        check_self_test(run_self_test(backends["target"], api.version), config.neuron.self_test_min_agreement)
    return backends["target"], backends.get("draft")


def load_on_device_backends(api: NeuronxApi, config: Config, plan: DeploymentPlan) -> tuple[Any, Any]:
    """engine fused: both models with on-device embedding and generation, no speculation network of their
    own (the fused decoder compiles its graph from them). Compiled at every load: the fused graph is not
    in what `save()` writes, and models returning token ids cannot be self-tested against logits."""
    from neuron_ssp.backends.neuron.on_device import OnDeviceBackend, on_device_neuron_config

    if config.neuron.compiled_dir:
        warnings.warn("engine fused compiles at every load: neuron.compiled_dir is not used", stacklevel=3)
    backends = {}
    for role in plan.load_order:
        model_cfg = model_config(config, role)
        model_dir = resolve_model_path(model_cfg.path, f"{role}.path")
        model = build_model(api, model_dir, model_cfg, None, None, on_device_neuron_config(config, model_dir))
        backends[role] = OnDeviceBackend(model, role, int(model.config.vocab_size), model_cfg.n_positions)
    return backends["target"], backends.get("draft")


def prepare_runtime(config: Config, plan: DeploymentPlan) -> NeuronxApi:
    """Everything that must hold before the first model touches the Neuron runtime."""
    validate_config(config).raise_if_invalid()
    api = load_neuronx()
    prepare_device(config, plan)
    return api


def prepare_device(config: Config, plan: DeploymentPlan) -> None:
    """A Neuron device is here; the plan's cores and the compile cache are set before the runtime starts
    (both libraries read them once, when the runtime starts)."""
    if not device_nodes():
        raise RuntimeProblem(
            Problem(
                "platform.backend",
                "neuron",
                "no Neuron device on this machine (no /dev/neuron*)",
                "run on an inf2 / trn1 / trn2 instance with the Neuron driver (aws-neuronx-dkms), or use "
                "platform.backend: torch; `neuron-ssp doctor` shows what this machine has",
            )
        )
    set_visible_cores(plan.visible_cores)
    if config.neuron.compile_cache_url:
        os.environ[COMPILE_CACHE_ENV] = config.neuron.compile_cache_url


def set_visible_cores(cores: str) -> None:
    """Restrict the runtime to the plan's contiguous core range; it reads this once, when it starts."""
    current = os.environ.get(VISIBLE_CORES_ENV)
    if current is not None and current != cores:
        raise UsageError(
            Problem(
                VISIBLE_CORES_ENV,
                current,
                f"the plan places the models on NeuronCores {cores}",
                f"unset {VISIBLE_CORES_ENV} (it is set from the plan) or move the models with "
                "target.first_core / draft.first_core",
            )
        )
    os.environ[VISIBLE_CORES_ENV] = cores


def build_model(
    api: NeuronxApi,
    model_dir: Path,
    model_cfg: ModelConfig,
    speculation_lengths: list[int] | None,
    artifacts: Path | None,
    neuron_config: Any = None,
) -> Any:
    """One LlamaForSampling on the device: compiled now, or loaded from `artifacts` when given."""
    extra = {} if neuron_config is None else {"neuron_config": neuron_config}
    model = api.llama_class.from_pretrained(str(model_dir), **api.constructor_kwargs(model_cfg), **extra)
    if speculation_lengths:
        api.enable_speculation(model, speculation_lengths)
    if artifacts is not None:
        model.load(str(artifacts))
    model.to_neuron()
    return model


def model_config(config: Config, role: str) -> ModelConfig:
    model = config.target if role == "target" else config.draft
    assert model is not None, f"the plan loads a {role} the config does not have"
    return model


def speculation_length(config: Config, role: str) -> int | None:
    """The target is compiled for the window k; the draft decodes one token per call."""
    return config.speculation.k if role == "target" else None
