"""/tokenize and /detokenize, in vLLM's shapes (vllm/entrypoints/serve/tokenize/protocol.py at 030ea52e).

/tokenize takes a completions body (`prompt`: the raw text) or a chat body (`messages`, rendered by the chat template
as /v1/chat/completions renders them, `add_generation_prompt` and `continue_final_message` included) and answers
`{count, max_model_len, tokens, token_strs}` (`token_strs` with `return_token_strs: true`). The ids are the ones a
generation route would see for the same body, so a client can count a prompt, or send ids back as a prompt or in
`logit_bias` and `stop_token_ids`. /detokenize takes `{tokens}` and answers `{prompt}`, special tokens kept (the
inverse of /tokenize). Neither checks the context: a count is what a client asks to learn.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

import torch
from pydantic import ConfigDict, Field

from neuron_ssp.errors import NeuronSSPError, Problem
from neuron_ssp.pipeline.prompts import ChatTurn
from neuron_ssp.serve.errors import ApiError
from neuron_ssp.serve.fields import Body, refused
from neuron_ssp.serve.schemas import ChatMessage, Prompt, TokenId, any_text, chat_turns, refusals, state_rules
from neuron_ssp.serve.served_pipeline import ServedPipeline
from neuron_ssp.serve.tool_calls import ToolDef, conversation, tool_use
from neuron_ssp.serve.validation import validate


class TokenizeCompletionBody(Body):
    model: str | None = Field(None, description="the served model (GET /v1/models)")
    prompt: Prompt = Field(description="the raw text, not only white space, tokenized as /v1/completions does")
    return_token_strs: bool = Field(False, description="also return each token's string")
    add_special_tokens: Any = refused(True)


class TokenizeChatBody(Body):
    model_config = ConfigDict(json_schema_extra=state_rules)

    model: str | None = Field(None, description="the served model (GET /v1/models)")
    messages: list[ChatMessage] = Field(
        min_length=1,
        json_schema_extra=any_text,
        description="rendered as /v1/chat/completions renders them; some message must hold some text",
    )
    add_generation_prompt: bool | None = Field(None, description="default true; false with continue_final_message")
    continue_final_message: bool = False
    return_token_strs: bool = Field(False, description="also return each token's string")
    add_special_tokens: Any = refused(False)
    chat_template: Any = refused()
    tools: Annotated[list[ToolDef], Field(min_length=1)] | None = Field(
        None, description="rendered as chat renders them"
    )


class DetokenizeBody(Body):
    model: str | None = Field(None, description="the served model (GET /v1/models)")
    tokens: list[TokenId] = Field(description="token ids of this model's vocabulary")


def tokenize(pipeline: ServedPipeline, data: dict[str, Any]) -> dict[str, Any]:
    """The answer to a /tokenize body (run on the encoder thread), or a 400 naming every problem."""
    if "messages" in data:
        chat = validate(TokenizeChatBody, data)
        turns, problems = chat_turns(chat.messages)
        use, tool_problems = tool_use(chat.tools, None, None)
        problems += tool_problems
        if chat.continue_final_message and chat.add_generation_prompt:
            problems.append(
                Problem(
                    "add_generation_prompt",
                    True,
                    "cannot be true with continue_final_message: true (vLLM's rule)",
                    "leave add_generation_prompt out",
                )
            )
        _raise(refusals(chat) + problems)
        opened = not chat.continue_final_message if chat.add_generation_prompt is None else chat.add_generation_prompt
        turn = ChatTurn(opened, chat.continue_final_message)
        messages, template_tools = conversation(turns, use, pipeline.template_renders_tools)
        ids = _encoded(lambda: pipeline.encode_messages(messages, None, turn, template_tools))
        wants_strs = chat.return_token_strs
    else:
        body = validate(TokenizeCompletionBody, data)
        _raise(refusals(body))
        ids = _encoded(lambda: pipeline.encode(body.prompt, chat_template=False))
        wants_strs = body.return_token_strs
    tokens = ids.tolist()
    return {
        "count": len(tokens),
        "max_model_len": pipeline.target.n_positions,
        "tokens": tokens,
        "token_strs": pipeline.tokenizer.convert_ids_to_tokens(tokens) if wants_strs else None,
    }


def detokenize(pipeline: ServedPipeline, data: dict[str, Any]) -> dict[str, Any]:
    """The answer to a /detokenize body: the ids' text, special tokens kept."""
    body = validate(DetokenizeBody, data)
    ids = within_vocabulary(pipeline, body.tokens, "tokens")
    return {"prompt": pipeline.tokenizer.decode(ids.tolist(), skip_special_tokens=False)}


def within_vocabulary(pipeline: ServedPipeline, ids: list[int], field: str) -> torch.Tensor:
    """Token ids a client sent, each checked against the vocabulary: the model has no embedding for an id past it
    (vLLM: "Token id ... is out of vocabulary"); a 400 names the first index outside it."""
    vocab = pipeline.target.vocab_size
    outside = [i for i, token in enumerate(ids) if token >= vocab]
    if outside:
        more = f"; {len(outside) - 1} more lie outside it too, at indices {outside[1:9]}" if len(outside) > 1 else ""
        raise ApiError(
            400,
            Problem(
                f"{field}.{outside[0]}",
                ids[outside[0]],
                f"not a token id of this model: its vocabulary holds ids 0..{vocab - 1}{more}",
                "send ids from this model's tokenizer (POST /tokenize gives them)",
            ),
        )
    return torch.tensor(ids, dtype=torch.long)


def _encoded(encode: Callable[[], torch.Tensor]) -> torch.Tensor:
    try:
        return encode()
    except NeuronSSPError as exc:
        raise ApiError(400, exc.problems) from None


def _raise(problems: list[Problem]) -> None:
    if problems:
        raise ApiError(400, problems)
