"""Text <-> token ids: chat template for instruct models, and the stop-token set."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from jinja2.exceptions import TemplateError
from transformers import PreTrainedTokenizerBase

from neuron_ssp.errors import Problem, UsageError
from neuron_ssp.pipeline.prompt_length import PromptLimit


@dataclass(frozen=True)
class ChatTurn:
    """How a rendered conversation ends: vLLM's request fields of the same names, passed to the chat template."""

    add_generation_prompt: bool = True  # open the assistant's turn
    continue_final_message: bool = False  # leave the last message open, for the model to continue


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
    messages: list[dict[str, Any]],
    chat_template: bool,
    limit: PromptLimit | None = None,
    turn: ChatTurn = ChatTurn(),
    tools: list[dict[Any, Any]] | None = None,
) -> torch.Tensor:
    """A chat conversation as ids: the tokenizer's template, else the turns' text one per line (which ends with the
    last message, so `turn` changes nothing there); `tools` (OpenAI's definitions) go to the template; with a
    `limit`, a rendered conversation that cannot fit is refused before it is tokenized."""
    if not any(m["content"].strip() for m in messages):
        raise UsageError(Problem("messages", messages, "every message is empty", "send some text to answer"))
    if chat_template and getattr(tokenizer, "chat_template", None):
        try:
            text = str(
                tokenizer.apply_chat_template(
                    messages,
                    tokenize=False,
                    add_generation_prompt=turn.add_generation_prompt,
                    continue_final_message=turn.continue_final_message,
                    tools=list(tools) if tools is not None else None,
                )
            )
        except TemplateError as exc:  # the template's own raise_exception (e.g. roles that must alternate)
            raise UsageError(
                Problem("messages", _roles(messages), f"the model's chat template refused them: {exc}", _TEMPLATE_FIX)
            ) from None
        except ValueError as exc:  # transformers: with continue_final_message, the last message is not found verbatim
            if not turn.continue_final_message:
                raise
            raise UsageError(
                Problem(
                    "continue_final_message",
                    True,
                    f"the chat template cannot leave the last message open: {exc}",
                    "send the last message's text without leading or trailing white space, or leave "
                    "continue_final_message out",
                )
            ) from None
        return _tokenize(tokenizer, text, False, limit, "messages")
    return _tokenize(tokenizer, "\n".join(m["content"] for m in messages), True, limit, "messages")


_TEMPLATE_FIX = "send the roles in an order the model's chat template takes (its tokenizer_config.json holds it)"


PROBE_TOOL = {
    "type": "function",
    "function": {"name": "probe_tool_4f1c", "description": "a probe", "parameters": {"type": "object"}},
}


def renders_tools(tokenizer: PreTrainedTokenizerBase, chat_template: bool) -> bool:
    """Whether the chat template renders the tools transformers passes it (Llama-3.1's does, SmolLM2's ignores them):
    a conversation rendered with a probe tool names it."""
    if not (chat_template and getattr(tokenizer, "chat_template", None)):
        return False
    probe = [{"role": "user", "content": "Hi"}]
    try:
        text = tokenizer.apply_chat_template(probe, tools=[PROBE_TOOL], tokenize=False, add_generation_prompt=True)
    except (TemplateError, ValueError, TypeError):  # a template that cannot take tools renders none
        return False
    return PROBE_TOOL["function"]["name"] in str(text)  # type: ignore[index]


def _roles(messages: list[dict[str, Any]]) -> list[str]:
    return [m["role"] for m in messages]


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
