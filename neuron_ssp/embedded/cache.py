"""Where converted embedded models live, and how a cache entry proves it is current.

Key: `<cache root>/<model>-transformers<major>`, so a 4.x and a 5.x venv sharing one cache never read
each other's conversion. Manifest: the format, the transformers/torch that wrote the entry, the GGUF it
came from, the size of every file and the hash of config.json, and the known answer it passed. An
entry without one (format 1, written before conversions were checked against a known answer: its LM
head may be random under transformers 4.4x), or with any of these changed, is stale and gets rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import transformers
from packaging.version import Version

CACHE_FORMAT = 2
MANIFEST = "neuron-ssp-manifest.json"
ENTRY_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def cache_root() -> Path:
    return Path(os.environ.get("NEURON_SSP_CACHE", Path.home() / ".cache" / "neuron-ssp"))


@contextmanager
def first_use_status(message: str) -> Iterator[None]:
    """A first run pauses for seconds while it fills the cache: say why, as a spinner on a terminal and as one
    line elsewhere (a live spinner in Jupyter feeds back into ipykernel's stderr until RecursionError)."""
    from rich.console import Console

    console = Console(stderr=True)
    if console.is_terminal and not console.is_jupyter:
        with console.status(message):
            yield
    else:
        console.print(message)
        yield


def transformers_major() -> int:
    return Version(transformers.__version__).major


def entry_dir(name: str) -> Path:
    return cache_root() / f"{name}-transformers{transformers_major()}"


def write_manifest(directory: Path, gguf_path: Path, known_answer: str) -> None:
    manifest = {
        "format": CACHE_FORMAT,
        "gguf": gguf_path.name,
        "gguf_bytes": gguf_path.stat().st_size,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "files": _file_sizes(directory),
        "config_sha256": _sha256(directory / "config.json"),
        "known_answer": known_answer,
    }
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")


def read_manifest(directory: Path) -> dict[str, Any] | None:
    try:
        return json.loads((directory / MANIFEST).read_text())
    except (OSError, ValueError):
        return None


def stale_reason(directory: Path, gguf_path: Path) -> str | None:
    """Why this entry cannot be used as it is (None: it is current)."""
    if not directory.is_dir():
        return "not converted yet"
    manifest = read_manifest(directory)
    if manifest is None:
        return "it has no readable manifest (written before neuron-ssp checked its conversions)"
    if manifest.get("format") != CACHE_FORMAT:
        return f"it has cache format {manifest.get('format')}, this neuron-ssp writes {CACHE_FORMAT}"
    written_by = str(manifest.get("transformers", "?"))
    if written_by.split(".")[0] != str(transformers_major()):
        return f"it was written by transformers {written_by}, this is {transformers.__version__}"
    if manifest.get("gguf") != gguf_path.name or manifest.get("gguf_bytes") != gguf_path.stat().st_size:
        return f"the packaged GGUF changed since ({gguf_path})"
    sizes = _file_sizes(directory)
    if sizes != manifest.get("files"):
        changed = sorted(f for f in ENTRY_FILES if sizes.get(f) != manifest.get("files", {}).get(f))
        return f"its files changed or are missing since it was written: {', '.join(changed)}"
    if _sha256(directory / "config.json") != manifest.get("config_sha256"):
        return "its config.json changed since it was written"
    return None


def _file_sizes(directory: Path) -> dict[str, int | None]:
    return {f: (directory / f).stat().st_size if (directory / f).is_file() else None for f in ENTRY_FILES}


def _sha256(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None
