"""Where a checkpoint says a generation ends: its end-of-sequence ids and the id that closes a chat turn.

Read from the model's directory, for every backend: a transformers-neuronx model object has no
`generation_config` attribute, so asking the loaded model (as one does with Hugging Face models) misses
the extra ids. They matter: Llama-3.1 adds 128008, and Llama-3-Instruct ends its turns with 128009
(<|eot_id|>) while its tokenizer's EOS may be 128001, so a reader of the tokenizer alone generates past
the end of the turn.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from pathlib import Path
from typing import Any

TURN_MARKER = "neuron-ssp-turn-end"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json")


def checkpoint_eos_ids(model_dir: Path) -> list[int]:
    """The `eos_token_id` (one or a list) of generation_config.json, else of config.json."""
    for name in ("generation_config.json", "config.json"):
        try:
            eos = json.loads((model_dir / name).read_text()).get("eos_token_id")
        except (OSError, json.JSONDecodeError, AttributeError):
            continue
        ids = [eos] if isinstance(eos, int) else [i for i in eos or [] if isinstance(i, int)]
        if ids:
            return ids
    return []


def turn_end_id(tokenizer: Any, eos_ids: Collection[int]) -> int | None:
    """The EOS id that follows an assistant message in the tokenizer's chat template (Llama-3: 128009);
    None without a template, or when no EOS id follows the message."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    conversation = [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": TURN_MARKER}]
    try:
        text = tokenizer.apply_chat_template(conversation, tokenize=False)
    except Exception:  # jinja raises its own errors: a template that refuses this conversation teaches nothing
        return None
    if not isinstance(text, str) or TURN_MARKER not in text:
        return None
    after = text[text.index(TURN_MARKER) + len(TURN_MARKER) :]
    return next((i for i in tokenizer(after, add_special_tokens=False)["input_ids"] if i in eos_ids), None)


def load_tokenizer(model_dir: Path) -> Any | None:
    """The directory's tokenizer; None where it has no tokenizer files (a bare test checkpoint). Asked
    without them, transformers raises OSError, ValueError, ImportError or AttributeError by version."""
    if not any((model_dir / name).is_file() for name in TOKENIZER_FILES):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


def stop_id(model_dir: Path, chat_template: bool) -> int | None:
    """The one id a loop that can stop at a single EOS should get: the end of a chat turn when prompts go
    through the chat template, else the tokenizer's EOS, else the checkpoint's first."""
    eos = checkpoint_eos_ids(model_dir)
    tokenizer = load_tokenizer(model_dir)
    if tokenizer is None:
        return eos[0] if eos else None
    own = tokenizer.eos_token_id if isinstance(tokenizer.eos_token_id, int) else None
    end = turn_end_id(tokenizer, {*eos, *([own] if own is not None else [])}) if chat_template else None
    return end if end is not None else own if own is not None else (eos[0] if eos else None)
