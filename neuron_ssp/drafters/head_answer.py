"""The shipped EAGLE-3 head's known answer, checked at every load as the embedded model's is (known_answer.py).

From a fixed prompt, the target's greedy token and then the head's greedy chain must be the recorded tokens
(`known_answer.json` beside the head, written by `record_head_answer` when the head is shipped). A head that loads
but drafts something else (a damaged file, another head put in its place) stops the load.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from neuron_ssp.backends.base import HiddenStates
from neuron_ssp.drafters.eagle import EagleDrafter, EagleModel
from neuron_ssp.embedded.heads import resolve_head_path
from neuron_ssp.embedded.known_answer import failure_rule
from neuron_ssp.errors import Problem, RuntimeProblem
from neuron_ssp.speculation.sampling import SamplingParams

ANSWER_FILE = "known_answer.json"
ANSWER_PROMPT = "The Eiffel Tower is located in the city of"
ANSWER_DRAFT = 4  # tokens of the head's greedy chain recorded


def head_answer(model: EagleModel, target: HiddenStates, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The target's greedy token after ANSWER_PROMPT, then the head's greedy chain of ANSWER_DRAFT tokens, through
    the drafting path (slot 0 of both caches, rewritten by the first request)."""
    ids = torch.tensor(tokenizer(ANSWER_PROMPT, add_special_tokens=False)["input_ids"])
    logits, taps = target.prefill_slot_hidden(0, ids)
    first = int(logits.argmax())
    drafter = EagleDrafter(model, 0, SamplingParams())
    drafter.begin(ids, ANSWER_DRAFT + 1)
    drafter.take_hidden(0, taps)
    draft = drafter.propose(torch.cat([ids, torch.tensor([first])]), ANSWER_DRAFT)
    return [first, *draft.tokens.tolist()]


def record_head_answer(
    model: EagleModel, target: HiddenStates, tokenizer: PreTrainedTokenizerBase, directory: Path
) -> list[int]:
    """Write the head's known answer beside it (when shipping a head); the tokens written."""
    tokens = head_answer(model, target, tokenizer)
    (Path(directory) / ANSWER_FILE).write_text(json.dumps({"prompt": ANSWER_PROMPT, "tokens": tokens}) + "\n")
    return tokens


def check_head_answer(
    model: EagleModel, target: HiddenStates, tokenizer: PreTrainedTokenizerBase, path: str, field: str = "draft.path"
) -> None:
    """At load of an embedded head: its greedy chain must be the recorded one."""
    directory = resolve_head_path(path, field)
    answer_file = directory / ANSWER_FILE
    if not answer_file.is_file():
        raise RuntimeProblem(
            Problem(
                field,
                path,
                f"the shipped head has no recorded known answer ({answer_file})",
                "record it with neuron_ssp.drafters.head_answer.record_head_answer when shipping the head",
            )
        )
    expected = json.loads(answer_file.read_text())["tokens"]
    got = head_answer(model, target, tokenizer)
    if got != expected:
        detail = f"from {ANSWER_PROMPT!r} it drafts {got} where {expected} was recorded"
        raise RuntimeProblem(
            Problem(
                field,
                path,
                failure_rule(f"the EAGLE-3 head in {directory}", detail),
                "reinstall neuron-ssp (the head's files are damaged or were replaced), or use drafter: ngram",
            )
        )
