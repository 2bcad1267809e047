"""Text <-> token ids: chat template for instruct models, and the stop-token set."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import PreTrainedTokenizerBase

from neuron_ssp.errors import Problem, UsageError
from neuron_ssp.pipeline.prompt_length import PromptLimit


def encode_prompt(
    tokenizer: PreTrainedTokenizerBase, prompt: str, chat_template: bool, limit: PromptLimit | None = None
) -> torch.Tensor:
    """The prompt as a user turn when the tokenizer has a chat template, else the raw text; with a `limit`, a text
    that cannot fit is refused before it is tokenized."""
    if not prompt.strip():
        raise UsageError(Problem("prompt", prompt, "the prompt is empty", "pass some text to generate from"))
    if chat_template and getattr(tokenizer, "chat_template", None):
        # render to text first: apply_chat_template's return type differs between transformers 4 and 5
        text = str(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
            )
        )
        return _tokenize(tokenizer, text, False, limit, "prompt")
    return _tokenize(tokenizer, prompt, True, limit, "prompt")


def encode_messages(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[dict[str, str]],
    chat_template: bool,
    limit: PromptLimit | None = None,
) -> torch.Tensor:
    """A chat conversation as ids: the tokenizer's template, else the turns' text one per line; with a `limit`, a
    rendered conversation that cannot fit is refused before it is tokenized."""
    if not any(m["content"].strip() for m in messages):
        raise UsageError(Problem("messages", messages, "every message is empty", "send some text to answer"))
    if chat_template and getattr(tokenizer, "chat_template", None):
        text = str(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
        return _tokenize(tokenizer, text, False, limit, "messages")
    return _tokenize(tokenizer, "\n".join(m["content"] for m in messages), True, limit, "messages")


def _tokenize(
    tokenizer: PreTrainedTokenizerBase, text: str, special_tokens: bool, limit: PromptLimit | None, field: str
) -> torch.Tensor:
    if limit is not None:
        limit.refuse_unfittable(text, field)
    return torch.tensor(tokenizer(text, add_special_tokens=special_tokens)["input_ids"], dtype=torch.long)


def stop_token_ids(
    tokenizer: PreTrainedTokenizerBase, extra: Sequence[str | int], model_eos: int | list[int] | None = None
) -> set[int]:
    """The model's EOS ids plus the configured stop tokens (as ids or token strings)."""
    ids: set[int] = set()
    for eos in (tokenizer.eos_token_id, model_eos):
        if isinstance(eos, int):
            ids.add(eos)
        elif isinstance(eos, list):
            ids.update(eos)
    for token in extra:
        if isinstance(token, int):
            ids.add(token)
            continue
        token_id = tokenizer.convert_tokens_to_ids(token)
        if token_id is None or token_id == tokenizer.unk_token_id:
            raise UsageError(
                Problem(
                    "generation.stop_tokens",
                    token,
                    "not a single token of this tokenizer",
                    "give a token string from the vocabulary (e.g. '<|im_end|>') or its id",
                )
            )
        ids.add(int(token_id))  # type: ignore[arg-type]  # one token string: one id
    return ids
