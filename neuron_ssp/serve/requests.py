"""A request body of any style -> one `GenerationRequest`: what the worker runs, with every problem of the body.

The bodies' fields and rules are serve/schemas.py's; the controls that change the tokens are serve/controls.py's.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal

from neuron_ssp.errors import Problem
from neuron_ssp.serve.controls import lmi_controls, one_constraint, request_controls
from neuron_ssp.serve.errors import ApiError
from neuron_ssp.serve.schemas import (
    INVOCATION_BODIES,
    ChatCompletionBody,
    CompletionBody,
    LmiBody,
    Sampling,
    chat_turns,
    dependency_problems,
    refusals,
)
from neuron_ssp.serve.tool_calls import ToolUse, Turn, tool_use
from neuron_ssp.serve.validation import validate
from neuron_ssp.speculation.controls import RequestControls

PROMPT_FIELDS = {"chat": "messages", "completion": "prompt", "lmi": "inputs"}
BUDGET_FIELDS = {"chat": "max_tokens", "completion": "max_tokens", "lmi": "parameters.max_new_tokens"}


@dataclass
class GenerationRequest:
    """What the worker needs from any body style; None means the server config's default."""

    kind: Literal["chat", "completion", "lmi"]
    prompt: str = ""
    prompt_ids: list[int] | None = None  # completions: a prompt sent as token ids
    prompt_ids_field: str = "prompt"  # where those ids are: `prompt`, or `prompt.0` for a list of one list
    turns: list[Turn] = field(default_factory=list)  # chat: the conversation
    tools: ToolUse | None = None  # chat: the tools and what the model may do with them
    add_generation_prompt: bool = True  # chat: open the assistant's turn
    continue_final_message: bool = False  # chat: leave the last message open, to be continued
    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    include_stop_str: bool = False  # vLLM's include_stop_str_in_output
    controls: RequestControls = field(default_factory=RequestControls)
    stream: bool = False
    include_usage: bool = False
    details: bool = False  # LMI: add `details` to the answer
    logprobs: bool = False
    top_logprobs: int = 0  # alternatives per position, with logprobs
    max_tokens_field: str | None = None  # chat: max_completion_tokens when that one set max_tokens
    n: int = 1  # choices
    problems: list[Problem] = field(default_factory=list)  # refused fields, reported with the pipeline's refusals

    @property
    def prompt_field(self) -> str:
        """The field that holds the prompt, as the client named it."""
        return PROMPT_FIELDS[self.kind]

    @property
    def budget_field(self) -> str:
        """The field that sets max_tokens, as the client named it (or would)."""
        return self.max_tokens_field or BUDGET_FIELDS[self.kind]


def chat_request(data: dict[str, Any]) -> GenerationRequest:
    """The chat body's request; what it asks and this server refuses is in `problems` (app.py answers them with the
    pipeline's refusals of its controls, in one 400)."""
    body = validate(ChatCompletionBody, data)
    request = _common("chat", body)
    request.turns, message_problems = chat_turns(body.messages)
    request.tools, tool_problems = tool_use(body.tools, body.tool_choice, body.parallel_tool_calls)
    request.problems += message_problems + tool_problems
    asked = request.tools.grammar() if request.tools and not tool_problems else None
    if asked is not None and request.controls.grammar is not None:
        request.problems.append(one_constraint([request.controls.grammar, asked]))
    elif asked is not None:
        request.controls = replace(request.controls, grammar=asked)
    request.continue_final_message = body.continue_final_message
    if body.continue_final_message and body.add_generation_prompt:
        request.problems.append(
            Problem(
                "add_generation_prompt",
                True,
                "cannot be true with continue_final_message: true (vLLM's rule): the last message is continued, "
                "not answered",
                "leave add_generation_prompt out (it defaults to false with continue_final_message)",
            )
        )
    default = not body.continue_final_message
    request.add_generation_prompt = default if body.add_generation_prompt is None else body.add_generation_prompt
    if body.max_completion_tokens is not None:
        request.max_tokens, request.max_tokens_field = body.max_completion_tokens, "max_completion_tokens"
    request.logprobs, request.top_logprobs = body.logprobs, body.top_logprobs or 0
    return request


def completion_request(data: dict[str, Any]) -> GenerationRequest:
    body = validate(CompletionBody, data)
    request = _common("completion", body)
    prompt = body.prompt
    if isinstance(prompt, str) or isinstance(prompt[0], str):
        request.prompt = prompt if isinstance(prompt, str) else prompt[0]
    elif isinstance(prompt[0], int):
        request.prompt_ids = list(prompt)
    else:
        request.prompt_ids, request.prompt_ids_field = list(prompt[0]), "prompt.0"
    request.logprobs, request.top_logprobs = body.logprobs is not None, body.logprobs or 0
    return request


def lmi_request(data: dict[str, Any]) -> GenerationRequest:
    body = validate(LmiBody, data)
    p = body.parameters
    sample = p.do_sample if p.do_sample is not None else bool(p.temperature)  # LMI 0.32 infers it
    controls, problems = lmi_controls(p)
    return GenerationRequest(
        "lmi",
        prompt=body.inputs,
        max_tokens=p.max_new_tokens,
        temperature=(p.temperature if p.temperature is not None else 1.0) if sample else 0.0,
        top_p=p.top_p,
        top_k=_top_k(p.top_k),
        seed=p.seed,
        stop=(p.stop_sequences or p.stop or []),
        stream=body.stream,
        details=p.details,
        controls=controls,
        problems=refusals(p, "parameters.") + problems,
    )


def invocation_request(data: dict[str, Any]) -> GenerationRequest:
    """SageMaker's /invocations takes any of the three bodies: the first key of INVOCATION_BODIES that the
    body holds decides which (/openapi.json states the same precedence)."""
    build = {LmiBody: lmi_request, ChatCompletionBody: chat_request, CompletionBody: completion_request}
    for key, model in INVOCATION_BODIES.items():
        if key in data:
            return build[model](data)
    raise ApiError(
        400,
        Problem(
            "body",
            sorted(data),
            "not a known body: expected `inputs` (LMI/TGI), `messages` (OpenAI chat) or `prompt` (OpenAI completions)",
            'send {"inputs": "...", "parameters": {...}} or an OpenAI body',
        ),
    )


def _common(kind: Literal["chat", "completion"], body: Sampling) -> GenerationRequest:
    """The fields chat and completions share, and their problems: the rules between fields, the fields this server
    refuses rather than ignores, and the controls' own."""
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    controls, control_problems = request_controls(body)
    nested = refusals(body.structured_outputs, "structured_outputs.") if body.structured_outputs else []
    return GenerationRequest(
        kind,
        model=body.model,
        max_tokens=body.max_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=_top_k(body.top_k),
        seed=body.seed,
        stop=stop,
        include_stop_str=body.include_stop_str_in_output,
        controls=controls,
        n=body.n,
        stream=body.stream,
        include_usage=bool(body.stream_options and body.stream_options.include_usage),
        problems=dependency_problems(body) + refusals(body) + nested + control_problems,
    )


def _top_k(value: int | None) -> int | None:
    return 0 if value == -1 else value  # -1 is vLLM's "off", and many clients send it
