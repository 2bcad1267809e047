"""EAGLE-3 heads a config names by `draft.path`: a local checkpoint directory, or the head shipped in the package
for the embedded model (`embedded:smollm2-135m-instruct-eagle3`, trained by `neuron-ssp train-draft`), whose known
answer is checked at every load (drafters/head_answer.py).
"""

from __future__ import annotations

from pathlib import Path

from neuron_ssp.config import EMBEDDED_DEFAULT, EMBEDDED_EAGLE3, EMBEDDED_PREFIX
from neuron_ssp.errors import Problem, RuntimeProblem, UsageError

DATA = Path(__file__).resolve().parent.parent / "data"
# embedded head -> (its directory in the package, the embedded target it was trained for)
EMBEDDED_HEADS = {EMBEDDED_EAGLE3: (DATA / "smollm2-135m-instruct-eagle3", EMBEDDED_DEFAULT)}


def resolve_head_path(path: str, field: str = "draft.path") -> Path:
    """A config's head path -> its checkpoint directory (checked by eagle_checkpoint.read_checkpoint)."""
    if path.startswith(EMBEDDED_PREFIX):
        if path not in EMBEDDED_HEADS:
            raise UsageError(
                Problem(field, path, "unknown embedded EAGLE-3 head", f"use one of {list(EMBEDDED_HEADS)}")
            )
        directory = EMBEDDED_HEADS[path][0]
        if not (directory / "config.json").is_file():
            raise RuntimeProblem(
                Problem(
                    field,
                    path,
                    f"this version of neuron-ssp ships no EAGLE-3 head for the embedded model (none in {directory})",
                    "train one with `neuron-ssp train-draft` and set draft.path to its directory, or use "
                    "speculation.drafter: ngram",
                )
            )
        return directory
    local = Path(path).expanduser()
    if not (local / "config.json").is_file():
        raise UsageError(
            Problem(
                field,
                path,
                "the directory does not exist" if not local.exists() else "no config.json in that directory",
                "point draft.path at an EAGLE-3 head's directory (config.json + model.safetensors), or use "
                f"{EMBEDDED_EAGLE3}",
            )
        )
    return local
