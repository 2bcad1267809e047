"""Known-answer checks: refuse to generate from weights that load without error but compute garbage.

A model can load "fine" and still be wrong: transformers 4.46 leaves the LM head of a tied-embedding GGUF
random (it does not tie it to the embeddings), and a damaged cache file reads back as valid tensors.
Two checks, both one forward pass, cheap enough to run at every load:

- `greedy_answer`: the model's greedy continuation of a fixed prompt, compared with stored token ids
  (teacher-forced: prompt + expected scored in one pass, each position's argmax must be the next
  expected token; identical to greedy decoding whenever it passes).
- `sentence_loss`: mean next-token loss on a fixed English sentence, which any language model of any
  vocabulary keeps far below uniform guessing (ln V). Used for `path:` models, where no answer is stored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import transformers
from transformers import PreTrainedModel, PreTrainedTokenizerBase

REFERENCE_SENTENCE = (
    "The Eiffel Tower is a wrought-iron lattice tower in Paris, France. It is named after the engineer "
    "Gustave Eiffel, whose company designed and built the tower for the 1889 World's Fair."
)
# A working model needs at most half of uniform guessing's loss (perplexity <= sqrt(V)); a random head
# scores at or above ln V.
LOSS_BOUND_FRACTION = 0.5


@dataclass(frozen=True)
class KnownAnswer:
    """A fixed prompt and the token ids a correct model continues it with (greedy)."""

    prompt: str
    expected_ids: tuple[int, ...]


@dataclass(frozen=True)
class CheckResult:
    passed: bool
    detail: str  # what was measured, phrased for an error message


def greedy_answer(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, answer: KnownAnswer) -> CheckResult:
    prompt_ids = _ids(tokenizer, answer.prompt)
    expected = list(answer.expected_ids)
    logits = _logits(model, prompt_ids + expected)
    predicted = logits[len(prompt_ids) - 1 : -1].argmax(-1).tolist()
    got, want = tokenizer.decode(predicted), tokenizer.decode(expected)
    if predicted == expected:
        return CheckResult(True, f"greedy continuation of {answer.prompt!r} is {want!r} as expected")
    return CheckResult(False, f"the greedy continuation of {answer.prompt!r} is {got!r} where {want!r} was expected")


def sentence_loss(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> CheckResult:
    ids = _ids(tokenizer, REFERENCE_SENTENCE)
    logits = _logits(model, ids)
    loss = float(torch.nn.functional.cross_entropy(logits[:-1], torch.tensor(ids[1:])))
    vocab = int(logits.shape[-1])
    bound = LOSS_BOUND_FRACTION * math.log(vocab)
    detail = (
        f"mean loss on a reference English sentence is {loss:.2f} nats (bound {bound:.2f} = half of "
        f"uniform guessing over {vocab} tokens)"
    )
    return CheckResult(loss <= bound, detail)


def failure_rule(what: str, detail: str) -> str:
    """The rule part of a known-answer error: what failed, under which transformers."""
    return (
        f"{what} failed its known-answer check under transformers {transformers.__version__} "
        f"(torch {torch.__version__}): {detail}. Its weights load but compute the wrong thing"
    )


def _ids(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    # no special tokens: transformers 4.4x and 5.x disagree on adding a BOS to GGUF tokenizers
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


@torch.inference_mode()
def _logits(model: PreTrainedModel, ids: list[int]) -> torch.Tensor:
    device = next(model.parameters()).device
    return model(input_ids=torch.tensor([ids], device=device), use_cache=False).logits[0].float().cpu()
