"""Models built for transformers-neuronx's fused decoder: on-device embedding and generation.

Both models of `engine: fused` are compiled with `NeuronConfig(on_device_embedding=True,
on_device_generation=GenerationConfig(...))` (config.py at 1ade6d74); they then return token ids,
not logits, so they are backends that cannot score for our loop (`OnDeviceBackend`). The loop that
drives them is `neuron_ssp.engines.fused`.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from neuron_ssp.backends.base import SingleSlot
from neuron_ssp.backends.checkpoint import checkpoint_eos_ids
from neuron_ssp.backends.neuron.api import NEURON_INDEX
from neuron_ssp.config import Config, SamplingConfig
from neuron_ssp.errors import Problem, RuntimeProblem


def load_fused_modules() -> tuple[ModuleType, ModuleType]:
    """(fused_speculation, config) of the installed library, or a RuntimeProblem naming what to install."""
    try:
        fused = importlib.import_module("transformers_neuronx.fused_speculation")
        config = importlib.import_module("transformers_neuronx.config")
    except ImportError as exc:
        raise RuntimeProblem(
            Problem(
                "speculation.engine",
                "fused",
                f"this transformers-neuronx has no fused_speculation module ({exc}); it ships from 0.13 (SDK 2.21)",
                f"pip install 'transformers-neuronx>=0.13,<0.14' --extra-index-url={NEURON_INDEX}, "
                "or use speculation.engine: native",
            )
        ) from None
    missing = [name for name in ("FusedSpeculativeDecoder",) if not hasattr(fused, name)]
    missing += [name for name in ("NeuronConfig", "GenerationConfig") if not hasattr(config, name)]
    if missing:
        raise RuntimeProblem(
            Problem(
                "speculation.engine",
                "fused",
                f"transformers-neuronx lacks {', '.join(missing)}",
                "install 0.13.x from the Neuron repository, or use speculation.engine: native",
            )
        )
    return fused, config


def generation_settings(sampling: SamplingConfig, eos_token_ids: list[int], vocab_size: int) -> dict[str, Any]:
    """GenerationConfig keyword arguments for our sampling settings (names from config.py at 1ade6d74)."""
    greedy = sampling.temperature == 0
    return {
        "do_sample": not greedy,
        "top_k": sampling.top_k or vocab_size,  # ours: 0 = off; theirs defaults to 50
        "top_p": sampling.top_p,
        "temperature": 1.0 if greedy else sampling.temperature,
        "eos_token_id": list(eos_token_ids) or None,
        "dynamic": False,
    }


def on_device_options(config: Config, model_dir: Path) -> dict[str, Any]:
    """The NeuronConfig keywords both models of the fused decoder are built with."""
    _, config_module = load_fused_modules()
    vocab_size = int(json.loads((model_dir / "config.json").read_text())["vocab_size"])
    ints = [t for t in config.generation.stop_tokens if isinstance(t, int)]
    eos = [*dict.fromkeys([*checkpoint_eos_ids(model_dir), *ints])]
    settings = generation_settings(config.sampling, eos, vocab_size)
    return {"on_device_embedding": True, "on_device_generation": config_module.GenerationConfig(**settings)}


class OnDeviceBackend(SingleSlot):
    """A model compiled with on-device generation: it returns token ids, so it cannot score for our loop.
    `model_dir`: the checkpoint it was built from (its tokenizer and generation config say where a turn ends)."""

    max_score_width: int | None = None

    def __init__(self, model: Any, name: str, vocab_size: int, n_positions: int, model_dir: Path | None = None):
        self.model = model
        self.name = name
        self.vocab_size = vocab_size
        self.n_positions = n_positions
        self.model_dir = model_dir

    def prefill(self, prompt_ids: torch.Tensor) -> torch.Tensor:
        raise self._refusal()

    def score(self, token_ids: torch.Tensor, start: int) -> torch.Tensor:
        raise self._refusal()

    def _refusal(self) -> RuntimeProblem:
        return RuntimeProblem(
            Problem(
                "speculation.engine",
                "fused",
                "models compiled for the fused decoder generate on device and return token ids, not logits, "
                "so plain decoding (compare, tune-k, latency baselines) cannot run on them",
                "measure the baseline with the same config and speculation.engine: native",
            )
        )
