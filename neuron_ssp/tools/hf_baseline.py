"""Hugging Face's own `model.generate()` on the same model and prompts: the peer we benchmark against.

Greedy (`do_sample=False`), batch 1, the same max_new_tokens and stop tokens as our runs, and a fresh
GenerationConfig so nothing from the checkpoint's defaults (sampling knobs, penalties) slips in. Prompt
lookup uses HF's PromptLookupCandidateGenerator; a model drafter uses HF's assisted generation with its
default schedule.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import dataclass

import torch
from transformers import GenerationConfig, PreTrainedModel
from transformers.utils import logging as transformers_logging

# HF's documented example value for prompt lookup (the candidate generator's own default is 10 too).
HF_PROMPT_LOOKUP_TOKENS = 10


@dataclass
class HfRun:
    tokens: list[int]  # generated tokens only, the stop token included when one was produced
    wall_s: float

    @property
    def tokens_per_s(self) -> float:
        return len(self.tokens) / self.wall_s if self.wall_s else 0.0


def hf_generate(
    model: PreTrainedModel,
    prompt_ids: torch.Tensor,
    max_new_tokens: int,
    eos_token_ids: Collection[int],
    prompt_lookup_tokens: int | None = None,
    assistant: PreTrainedModel | None = None,
) -> HfRun:
    device = next(model.parameters()).device
    input_ids = prompt_ids.view(1, -1).to(device)
    stop = sorted(eos_token_ids)
    config = GenerationConfig(
        do_sample=False,
        max_new_tokens=max_new_tokens,
        eos_token_id=stop,
        pad_token_id=stop[0] if stop else None,
        prompt_lookup_num_tokens=prompt_lookup_tokens,
    )
    verbosity = transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_error()  # assisted generation warns about its own internal call
    try:
        start = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                generation_config=config,
                assistant_model=assistant,
            )
        wall = time.perf_counter() - start
    finally:
        transformers_logging.set_verbosity(verbosity)
    return HfRun(out[0, input_ids.shape[1] :].tolist(), wall)


def hf_model(backend: object) -> PreTrainedModel | None:
    """The Hugging Face model behind a torch backend; None on Neuron (nothing to compare there)."""
    model = getattr(backend, "model", None)
    return model if isinstance(model, PreTrainedModel) else None
