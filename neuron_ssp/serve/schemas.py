"""Request bodies -> one `GenerationRequest`: OpenAI chat/completions (vLLM's field set) and LMI/TGI.

Every rule a single field obeys is a constraint on its pydantic model (types strict: JSON integers, numbers,
booleans, no "3" or true for an integer; finite numbers; 64-bit seeds; valid Unicode; ranges and lengths), so
one declaration both checks a body (serve/validation.py turns each error into field, value, rule and fix,
all at once) and states the limit in /openapi.json. Rules between two fields (DEPENDS_ON) are checked here
and stated there as `if`/`then`. Unknown fields are accepted and ignored, as OpenAI's and vLLM's servers do,
except those that would change the answer and that this server cannot honour (NO_OP_VALUES): those are
refused, unless they carry the value that asks for nothing (what OpenAI clients send as defaults).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

from neuron_ssp.errors import Problem
from neuron_ssp.serve.errors import ApiError
from neuron_ssp.serve.validation import validate

MAX_STOP_STRINGS = 4  # OpenAI's limit
MAX_TOP_LOGPROBS = 20  # OpenAI's limit for chat (completions: 5); vLLM's default max_logprobs
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1  # vLLM's seed bounds (torch.long); torch seeds take any of them
# Python's white space (str.isspace, what the prompt checks strip; none lies above U+3000) as a pattern that
# pydantic's regex and JSON Schema's both read: a text must hold one character outside it
NOT_BLANK = "[^" + "".join(f"\\u{i:04x}" for i in range(0x3001) if chr(i).isspace()) + "]"
# fields that would change the answer and that this server cannot honour -> the values that ask for nothing
NO_OP_VALUES: dict[str, tuple[Any, ...]] = {
    "tools": (),
    "tool_choice": ("none",),
    "functions": (),
    "function_call": ("none",),
    "response_format": ({"type": "text"},),
    "logit_bias": ({},),
    "frequency_penalty": (0,),
    "presence_penalty": (0,),
    "echo": (False,),
    "suffix": ("",),
    "best_of": (1,),
}
DEPENDS_ON = {"stream_options": "stream", "top_logprobs": "logprobs"}  # allowed only with the other one true


def _unicode(text: str) -> str:
    """JSON may escape a lone surrogate ("\\ud800"): not text a tokenizer can encode or a reply can hold."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"holds a lone surrogate at character {exc.start}: not valid Unicode text") from None
    return text


def _integral(value: Any) -> Any:
    """JSON Schema's integer: 3.0 is one (Python's parser reads it as a float), "3" and true are not."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


INTEGRAL = BeforeValidator(_integral)  # after a type's constraints, so that JSON Schema states them
Text = Annotated[str, AfterValidator(_unicode)]
Prompt = Annotated[str, Field(pattern=NOT_BLANK), AfterValidator(_unicode)]  # constraints first: then the
StopString = Annotated[str, Field(min_length=1), AfterValidator(_unicode)]  # JSON Schema states them too
StopList = Annotated[list[StopString], Field(max_length=MAX_STOP_STRINGS)]
Seed = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX), INTEGRAL]
Budget = Annotated[int, Field(ge=1), INTEGRAL]
Temperature = Annotated[float, Field(ge=0, le=2)]
TopP = Annotated[float, Field(gt=0, le=1)]
TopK = Annotated[int, Field(ge=-1), INTEGRAL]
TopLogprobs = Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS), INTEGRAL]
One = Annotated[int, Field(ge=1, le=1), INTEGRAL]


# what a sampling field is for: the OpenAPI description, and the reason a message gives with a field's rule
SEED = "64-bit: send it back to reproduce a sample"
BUDGET = "tokens to generate at most: with the prompt's they must fit the model's context (max_model_len)"
TEMPERATURE = "0 = greedy; 2 at most, OpenAI's range, which vLLM 0.33.0 enforces too"
TOP_P, TOP_K = "nucleus sampling: 1 = off", "0 or -1 = off (vLLM's extra field; vLLM prefers 0)"


def _refused(name: str) -> Any:
    """A field this server cannot honour: documented as taking only the values that ask for nothing."""
    no_ops = NO_OP_VALUES[name]
    unless = f" unless {' or '.join(json.dumps(v) for v in no_ops)}" if no_ops else ""
    return Field(None, description=f"not supported: refused{unless}", json_schema_extra={"enum": [None, *no_ops]})


def _dependencies(model: type[BaseModel]) -> list[tuple[str, str]]:
    """The DEPENDS_ON pairs that are both fields of `model` (an unknown field is ignored, whatever its name)."""
    return [
        (name, other)
        for name, other in DEPENDS_ON.items()
        if name in model.model_fields and other in model.model_fields
    ]


def _state_dependencies(schema: dict[str, Any], model: type[BaseModel]) -> None:
    """The model's dependencies in JSON Schema: a field that is set (not null) requires the other one true."""
    rules = [
        {
            "if": {"properties": {name: {"not": {"type": "null"}}}, "required": [name]},
            "then": {"properties": {other: {"const": True}}, "required": [other]},
        }
        for name, other in _dependencies(model)
    ]
    if rules:
        schema["allOf"] = rules


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False, strict=True)


class TextPart(_Body):
    type: Literal["text"]
    text: Text


class ChatMessage(_Body):
    role: Literal["system", "user", "assistant", "developer"]
    content: Text | list[TextPart]


class StreamOptions(_Body):
    include_usage: bool = False


class _Sampling(_Body):
    model_config = ConfigDict(json_schema_extra=_state_dependencies)

    model: Text | None = Field(None, description="the served model (GET /v1/models)")
    max_tokens: Budget | None = Field(None, description=BUDGET)
    temperature: Temperature | None = Field(None, description=TEMPERATURE)
    top_p: TopP | None = Field(None, description=TOP_P)
    top_k: TopK | None = Field(None, description=TOP_K)
    seed: Seed | None = Field(None, description=SEED)
    stop: StopString | StopList | None = Field(None, description="text that ends the answer (not returned)")
    stream: bool = False
    stream_options: StreamOptions | None = Field(None, description="only with stream: true")
    n: One = Field(1, description="one completion per request: send one request per completion")
    tools: Any = _refused("tools")
    tool_choice: Any = _refused("tool_choice")
    functions: Any = _refused("functions")
    function_call: Any = _refused("function_call")
    response_format: Any = _refused("response_format")
    logit_bias: Any = _refused("logit_bias")
    frequency_penalty: Any = _refused("frequency_penalty")
    presence_penalty: Any = _refused("presence_penalty")
    echo: Any = _refused("echo")
    suffix: Any = _refused("suffix")
    best_of: Any = _refused("best_of")


def _any_text(schema: dict[str, Any]) -> None:
    """The prompt check's rule for a conversation, stated: some message holds some text."""
    text = {"type": "string", "pattern": NOT_BLANK}
    schema["contains"] = {
        "properties": {"content": {"anyOf": [text, {"type": "array", "contains": {"properties": {"text": text}}}]}}
    }


class ChatCompletionBody(_Sampling):
    messages: list[ChatMessage] = Field(
        min_length=1, json_schema_extra=_any_text, description="the conversation; some message must hold some text"
    )
    max_completion_tokens: Budget | None = Field(None, description=f"{BUDGET}; wins over max_tokens")
    logprobs: bool = False
    top_logprobs: TopLogprobs | None = Field(None, description="alternatives per token, with logprobs: true")


class CompletionBody(_Sampling):
    prompt: Prompt | Annotated[list[Prompt], Field(min_length=1, max_length=1)] = Field(
        description="one text, not only white space; a list holds exactly one (send one request per prompt)"
    )
    logprobs: TopLogprobs | None = Field(None, description="the most likely tokens per position")


class LmiParameters(_Body):
    """SageMaker LMI (DJL Serving) / TGI `parameters`; LMI <= 0.31 samples only with do_sample."""

    max_new_tokens: Budget | None = Field(None, description=BUDGET)
    do_sample: bool | None = None
    temperature: Temperature | None = Field(None, description=TEMPERATURE)
    top_p: TopP | None = Field(None, description=TOP_P)
    top_k: TopK | None = Field(None, description=TOP_K)
    seed: Seed | None = Field(None, description=SEED)
    stop: StopList | None = Field(None, description="TGI's name for stop_sequences")
    stop_sequences: StopList | None = Field(None, description="text that ends the answer (not returned)")
    details: bool = False


class LmiBody(_Body):
    inputs: Prompt = Field(description="the raw text, not only white space")
    parameters: LmiParameters = LmiParameters()
    stream: bool = False


PROMPT_FIELDS = {"chat": "messages", "completion": "prompt", "lmi": "inputs"}
BUDGET_FIELDS = {"chat": "max_tokens", "completion": "max_tokens", "lmi": "parameters.max_new_tokens"}


@dataclass
class GenerationRequest:
    """What the worker needs from any body style; None means the server config's default."""

    kind: Literal["chat", "completion", "lmi"]
    prompt: str = ""
    messages: list[dict[str, str]] = field(default_factory=list)
    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    details: bool = False  # LMI: add `details` to the answer
    logprobs: bool = False
    top_logprobs: int = 0  # alternatives per position, with logprobs
    max_tokens_field: str | None = None  # chat: max_completion_tokens when that one set max_tokens

    @property
    def prompt_field(self) -> str:
        """The field that holds the prompt, as the client named it."""
        return PROMPT_FIELDS[self.kind]

    @property
    def budget_field(self) -> str:
        """The field that sets max_tokens, as the client named it (or would)."""
        return self.max_tokens_field or BUDGET_FIELDS[self.kind]


def chat_request(data: dict[str, Any]) -> GenerationRequest:
    body = validate(ChatCompletionBody, data)
    _raise(_sampling_problems(body))
    messages = [
        {"role": m.role, "content": m.content if isinstance(m.content, str) else "".join(p.text for p in m.content)}
        for m in body.messages
    ]
    request = _common("chat", body)
    request.messages = messages
    if body.max_completion_tokens is not None:
        request.max_tokens, request.max_tokens_field = body.max_completion_tokens, "max_completion_tokens"
    request.logprobs, request.top_logprobs = body.logprobs, body.top_logprobs or 0
    return request


def completion_request(data: dict[str, Any]) -> GenerationRequest:
    body = validate(CompletionBody, data)
    _raise(_sampling_problems(body))
    request = _common("completion", body)
    request.prompt = body.prompt if isinstance(body.prompt, str) else body.prompt[0]
    request.logprobs, request.top_logprobs = body.logprobs is not None, body.logprobs or 0
    return request


def lmi_request(data: dict[str, Any]) -> GenerationRequest:
    body = validate(LmiBody, data)
    p = body.parameters
    sample = p.do_sample if p.do_sample is not None else bool(p.temperature)  # LMI 0.32 infers it
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
    )


INVOCATION_BODIES: dict[str, type[BaseModel]] = {
    "inputs": LmiBody,
    "messages": ChatCompletionBody,
    "prompt": CompletionBody,
}  # in this order


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


def _common(kind: Literal["chat", "completion"], body: _Sampling) -> GenerationRequest:
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    return GenerationRequest(
        kind,
        model=body.model,
        max_tokens=body.max_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=_top_k(body.top_k),
        seed=body.seed,
        stop=stop,
        stream=body.stream,
        include_usage=bool(body.stream_options and body.stream_options.include_usage),
    )


def _top_k(value: int | None) -> int | None:
    return 0 if value == -1 else value  # -1 is vLLM's "off", and many clients send it


def _sampling_problems(body: _Sampling) -> list[Problem]:
    """The rules between fields, and the fields this server refuses rather than ignores."""
    dependent = [
        Problem(
            name,
            value.model_dump() if isinstance(value, BaseModel) else value,
            f"only allowed with {other}: true (OpenAI's and vLLM's rule)",
            f"send {other}: true with it, or leave {name} out",
        )
        for name, other in _dependencies(type(body))
        if (value := getattr(body, name)) is not None and getattr(body, other) is not True
    ]
    return dependent + [
        Problem(
            name,
            value,
            "not supported by this server: speculative sampling here returns plain text from "
            "the model's own distribution (no tool calls, structured output, penalties, biases, echo, suffix "
            "or best-of)",
            f"leave {name} out",
        )
        for name, no_ops in NO_OP_VALUES.items()
        if (value := getattr(body, name)) is not None and not any(_same(value, ok) for ok in no_ops)
    ]


def _same(value: Any, ok: Any) -> bool:
    """JSON equality: 0 == 0.0, but false is not 0."""
    return value == ok and isinstance(value, bool) == isinstance(ok, bool)


def _raise(problems: list[Problem]) -> None:
    if problems:
        raise ApiError(400, problems)
