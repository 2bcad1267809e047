"""A config's models, checked and found on disk once, before anything loads.

The pipeline calls `resolve_models` once and hands the result down: the loaders, the self-test and the engines
read each model's directory from `ModelDirs` instead of resolving the config's paths again. A loader called on its
own (a test, a benchmark) resolves here too.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from neuron_ssp.config import Config, ModelConfig
from neuron_ssp.embedded.models import resolve_model_path
from neuron_ssp.topology.batch_rules import TNX
from neuron_ssp.topology.placement import loaded_models
from neuron_ssp.topology.validate import validate_config
from neuron_ssp.topology.vllm_neuron import refuse_loading


@dataclass(frozen=True)
class ModelDirs:
    """The local Hugging Face directory of every model a config loads (`loaded_models`: the target, and a draft
    model or, on Neuron, an EAGLE head)."""

    target: Path
    draft: Path | None = None

    def of(self, role: str) -> Path:
        directory = self.target if role == "target" else self.draft
        assert directory is not None, f"the plan loads a {role} the config does not have"
        return directory


def resolve_models(config: Config, windows: list[int] | None = None) -> ModelDirs:
    """What must fail before a weight is read: a vllm-neuron config (vLLM loads its models, never neuron-ssp) and
    every problem of the config at once (validate_config: topology, placement and memory, for the installed
    transformers-neuronx where it loads the models, with a target compiled for `windows`); then each loaded model's
    directory: the embedded model converted on first use, a local path checked."""
    rules = installed_rules(config, windows)  # nothing for vllm-neuron: not transformers-neuronx
    refuse_loading(config, "this command")
    validate_config(config, **rules).raise_if_invalid()
    dirs = {role: resolve_model_path(model.path, f"{role}.path") for role, model in loaded_models(config).items()}
    return ModelDirs(dirs["target"], dirs.get("draft"))


def model_config(config: Config, role: str) -> ModelConfig:
    """The config's section of the model a plan names by its role: `target`, or `draft` (a draft model or a head)."""
    model = config.target if role == "target" else config.draft
    assert model is not None, f"the plan loads a {role} the config does not have"
    return model


def installed_rules(config: Config, windows: list[int] | None) -> dict[str, Any]:
    """What validate_config must know of the installed transformers-neuronx for a config it loads: how it lays out
    kv heads, the generation it behaves as (batch_rules, keyed by what the build does: neuron/api.py, probe.py) and,
    where one target holds every k, the windows it is compiled for. Nothing for another library, nor where it is not
    installed: the config's own rules are checked, and the loader says what to install."""
    if config.platform.backend != "neuron" or config.neuron.library != TNX:
        return {}
    if importlib.util.find_spec("transformers_neuronx") is None:
        return {}
    from neuron_ssp.backends.neuron.api import load_neuronx

    api = load_neuronx()
    installed = api.behaviour
    return {
        "kv_rule": api.kv_rule,
        "windows": windows if windows and api.speculation_takes_k_list else None,
        "neuronx_generation": installed.generation,
        "neuronx_installed": installed.describe(),
    }
