"""Model architectures: the shapes that decide device memory, tp padding and vocabulary checks.

Configs name models by local directory (`/opt/models/Llama-2-70b-hf`), which usually does not exist
on the laptop where a config is validated. So the architecture comes from, in order: the config's
`architecture:` hint, the embedded default, the model's own `config.json` when the directory is
here, and finally the directory's name matched against the catalog.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from neuron_ssp.config import EMBEDDED_DEFAULT, EMBEDDED_PREFIX, ModelConfig
from neuron_ssp.errors import Problem, UsageError


@dataclass(frozen=True)
class Architecture:
    """The numbers of a Llama-style decoder that the topology rules need."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    params: int
    source: str = "catalog"
    intermediate: int = 0  # the MLP's width (an EAGLE head shaped like its target's layers takes it)


# Parameter counts are those of the released checkpoints (untied embeddings, except SmolLM2).
ARCHITECTURES: dict[str, Architecture] = {
    a.name: a
    for a in (
        Architecture("llama-2-7b", 32, 4096, 32, 32, 128, 32000, 6_738_415_616, intermediate=11008),
        Architecture("llama-2-13b", 40, 5120, 40, 40, 128, 32000, 13_015_864_320, intermediate=13824),
        Architecture("llama-2-70b", 80, 8192, 64, 8, 128, 32000, 68_976_648_192, intermediate=28672),
        Architecture("llama-3-8b", 32, 4096, 32, 8, 128, 128256, 8_030_261_248, intermediate=14336),
        Architecture("llama-3-70b", 80, 8192, 64, 8, 128, 128256, 70_553_706_496, intermediate=28672),
        Architecture("llama-3.1-8b", 32, 4096, 32, 8, 128, 128256, 8_030_261_248, intermediate=14336),
        Architecture("llama-3.1-70b", 80, 8192, 64, 8, 128, 128256, 70_553_706_496, intermediate=28672),
        Architecture("llama-3.2-1b", 16, 2048, 32, 8, 64, 128256, 1_235_814_400, intermediate=8192),  # tied
        Architecture("llama-3.3-70b", 80, 8192, 64, 8, 128, 128256, 70_553_706_496, intermediate=28672),
        Architecture("smollm2-135m-instruct", 30, 576, 9, 3, 64, 49152, 134_515_008, intermediate=1536),
    )
}

EMBEDDED_ARCHITECTURES = {EMBEDDED_DEFAULT: ARCHITECTURES["smollm2-135m-instruct"]}

# "Meta-Llama-3.1-70B-Instruct", "Llama-2-7b-chat-hf", "llama2_13b", "Llama-3.2-1B" -> llama-3.1-70b, ...
_NAME_PATTERN = re.compile(r"llama-?(2|3\.[123]|3)-(\d+)b(?![a-z0-9])")


class HeadModel(ModelConfig):
    """The `draft:` section of an EAGLE drafter: a head that drafts from `target`'s hidden states, one decoder layer
    on the device beside it (placement.loaded_models builds it)."""

    target: ModelConfig


def resolve_architecture(model: ModelConfig, role: str) -> Architecture:
    """The architecture of one configured model; UsageError naming `<role>.path` if unknown."""
    if isinstance(model, HeadModel):
        return head_architecture(model, resolve_architecture(model.target, "target"))
    if model.architecture is not None:
        return _from_hint(model.architecture, role)
    if model.path.startswith(EMBEDDED_PREFIX):
        return _from_embedded(model.path, role)
    config_json = _config_json(model.path)
    if config_json is not None:
        return read_config_json(config_json, role)
    by_name = architecture_for_name(model.path)
    if by_name is not None:
        return by_name
    raise UsageError(
        Problem(
            f"{role}.path",
            model.path,
            "cannot tell the model's architecture: the directory name matches no catalog entry "
            "and no config.json is readable there",
            f"add `architecture:` to the {role} section (one of {', '.join(ARCHITECTURES)}), "
            "or run where the model directory and its config.json exist",
        )
    )


def head_architecture(head: ModelConfig, target: Architecture) -> Architecture:
    """An EAGLE head as the device holds it: its own config.json where the directory is here, else shaped like one
    layer of its target (its width, heads and MLP, as SafeAILab's and vLLM's Llama heads are), with the target's
    embedding and an lm_head over the whole vocabulary (what NxD Inference loads after `neuron-ssp prepare-draft`;
    an upper bound for a reduced-vocabulary head)."""
    data = _head_json(head.path)
    hidden = int(data.get("hidden_size", target.hidden))
    heads = int(data.get("num_attention_heads", target.heads))
    kv_heads = int(data.get("num_key_value_heads") or data.get("num_attention_heads") or target.kv_heads)
    head_dim = int(data.get("head_dim") or hidden // heads)
    intermediate = int(data.get("intermediate_size", target.intermediate))
    vocab = int(data.get("vocab_size", target.vocab))
    draft_vocab = int(data.get("draft_vocab_size") or vocab)
    target_hidden = int(data.get("target_hidden_size") or target.hidden)
    attention = 2 * hidden * (heads + 2 * kv_heads) * head_dim + heads * head_dim * hidden  # q, k, v read 2H
    params = (
        3 * target_hidden * hidden  # fc over the three taps
        + attention
        + 3 * hidden * intermediate
        + 4 * hidden  # input, hidden and post-attention norms, final norm
        + (vocab + draft_vocab) * hidden  # embedding, lm_head
    )
    source = str(Path(head.path) / "config.json") if data else f"shaped like a layer of {target.name} (assumed)"
    name = f"eagle-head-{target.name}"
    return Architecture(name, 1, hidden, heads, kv_heads, head_dim, vocab, params, source, intermediate)


def _head_json(path: str) -> dict:
    """The head's config.json as a dict where the directory is here; {} otherwise."""
    candidate = _config_json(path)
    if candidate is None:
        return {}
    try:
        data = json.loads(candidate.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def architecture_for_name(path: str) -> Architecture | None:
    """The catalog entry whose name the directory's name contains, e.g. `Llama-2-70b-hf`."""
    name = PurePosixPath(path.rstrip("/")).name.lower().replace("_", "-")
    match = _NAME_PATTERN.search(name)
    if match is None:
        return None
    return ARCHITECTURES.get(f"llama-{match.group(1)}-{match.group(2)}b")


def read_config_json(path: Path, role: str) -> Architecture:
    """Shapes and parameter count of a Llama-style model from its Hugging Face `config.json`."""
    try:
        data = json.loads(path.read_text())
        layers, hidden = int(data["num_hidden_layers"]), int(data["hidden_size"])
        heads, vocab = int(data["num_attention_heads"]), int(data["vocab_size"])
        kv_heads = int(data.get("num_key_value_heads") or heads)
        head_dim = int(data.get("head_dim") or hidden // heads)
        intermediate = int(data["intermediate_size"])
    except (OSError, ValueError, TypeError, KeyError, ZeroDivisionError) as exc:
        raise UsageError(
            Problem(
                f"{role}.path",
                str(path),
                f"config.json is not a readable Llama config ({_describe(exc)})",
                f"fix the file, or add `architecture:` to the {role} section naming a catalog entry",
            )
        ) from None
    params = _llama_params(
        layers,
        hidden,
        heads,
        kv_heads,
        head_dim,
        vocab,
        intermediate,
        tied=bool(data.get("tie_word_embeddings", False)),
    )
    known = architecture_for_name(str(path.parent))
    name = known.name if known is not None else path.parent.name
    return Architecture(name, layers, hidden, heads, kv_heads, head_dim, vocab, params, str(path), intermediate)


def _from_hint(hint: str, role: str) -> Architecture:
    architecture = ARCHITECTURES.get(hint.strip().lower())
    if architecture is None:
        raise UsageError(
            Problem(
                f"{role}.architecture", hint, "not a catalog architecture", f"use one of {', '.join(ARCHITECTURES)}"
            )
        )
    return architecture


def _from_embedded(path: str, role: str) -> Architecture:
    architecture = EMBEDDED_ARCHITECTURES.get(path)
    if architecture is None:
        raise UsageError(
            Problem(f"{role}.path", path, "not an embedded model", f"use {EMBEDDED_DEFAULT} or a local model directory")
        )
    return architecture


def _config_json(path: str) -> Path | None:
    candidate = Path(path) / "config.json"
    try:
        return candidate if candidate.is_file() else None
    except (OSError, ValueError):  # unreadable or malformed path (e.g. a NUL byte): treat as absent
        return None


def _llama_params(
    layers: int, hidden: int, heads: int, kv_heads: int, head_dim: int, vocab: int, intermediate: int, tied: bool
) -> int:
    attention = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2  # q, o and k, v
    per_layer = attention + 3 * hidden * intermediate + 2 * hidden  # gate/up/down, two RMSNorms
    embeddings = vocab * hidden * (1 if tied else 2)
    return embeddings + layers * per_layer + hidden


def _describe(exc: Exception) -> str:
    return f"missing key {exc}" if isinstance(exc, KeyError) else str(exc) or type(exc).__name__
