"""Known-answer check of any model path (`neuron-ssp doctor --check-model PATH`).

Before a compile that takes an hour, make sure the checkpoint itself computes sensible text under this
venv's transformers: the reference-sentence loss for every model, and the stored greedy answer for the
embedded one. The model loads on CPU in its checkpoint's dtype (a 70B needs its size in host memory).
"""

from __future__ import annotations

from typing import Any

import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as transformers_logging

from neuron_ssp.backends.torch.load import dtype_kwarg
from neuron_ssp.config import EMBEDDED_PREFIX
from neuron_ssp.embedded.known_answer import greedy_answer, sentence_loss
from neuron_ssp.embedded.models import EMBEDDED_MODELS, resolve_model_path
from neuron_ssp.errors import NeuronSSPError


def check_model(path: str) -> dict[str, Any]:
    """{"path", "passed", "details": [...], "transformers"}; a path that cannot load fails with the reason."""
    report: dict[str, Any] = {"path": path, "transformers": transformers.__version__}
    transformers_logging.disable_progress_bar()
    try:
        directory = resolve_model_path(path, "--check-model")
        tokenizer = AutoTokenizer.from_pretrained(str(directory))
        model = AutoModelForCausalLM.from_pretrained(str(directory), **{dtype_kwarg(): "auto"}).eval()
    except NeuronSSPError as exc:
        return {**report, "passed": False, "details": [str(problem) for problem in exc.problems]}
    except (OSError, ValueError) as exc:
        return {**report, "passed": False, "details": [f"could not load it: {exc}"]}
    checks = [sentence_loss(model, tokenizer)]
    name = path.removeprefix(EMBEDDED_PREFIX)
    if path.startswith(EMBEDDED_PREFIX) and name in EMBEDDED_MODELS:
        checks.append(greedy_answer(model, tokenizer, EMBEDDED_MODELS[name].answer))
    return {**report, "passed": all(c.passed for c in checks), "details": [c.detail for c in checks]}
