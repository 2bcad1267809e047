"""The API described: /openapi.json (and the /docs page FastAPI renders from it) for every route.

Request bodies come from the pydantic models the server validates with (serve/schemas.py), so every limit a
field's check enforces is stated by the same declaration; the rest depend on the running server and are stated
from the values its checks use: the one model it serves, the largest budget any prompt leaves, the vocabulary
(token ids), and which controls its pipeline runs (a control it refuses is stated as taking only the values that
ask for nothing: `refused_controls` asks the pipeline, as a request would). Response
bodies and the error body come from the models below, whose shapes serve/responses.py and serve/sagemaker.py
build (tests/test_serve_fuzz.py checks real answers against them), streams by their content types. Client
generators and API fuzzers start from this document, as they do from vLLM's server.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from neuron_ssp.serve.fields import REFUSED
from neuron_ssp.serve.schemas import INVOCATION_BODIES, ChatCompletionBody, CompletionBody, LmiBody
from neuron_ssp.serve.tokens import DetokenizeBody, TokenizeChatBody, TokenizeCompletionBody
from neuron_ssp.speculation.controls import Grammar, RequestControls

if TYPE_CHECKING:
    from neuron_ssp.serve.served_pipeline import ServedPipeline

VERSION = "1"
DESCRIPTION = (
    "Speculative sampling behind OpenAI's chat and completions API and SageMaker's container contract. "
    'Every error is `{"error": {"message", "type", "param", "code"}}`; the message names the '
    "field, the value, the rule and the fix."
)


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None
    code: int


class ErrorResponse(BaseModel):
    error: ErrorInfo


class PromptTokensDetails(BaseModel):
    cached_tokens: int  # prompt tokens whose keys and values came from the prefix cache (not prefilled again)


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int  # tokens whose text is returned (none past a stop string)
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None  # absent in a stream cut short


class SpeculativeStats(BaseModel):
    """The extra field `speculative`: this request's speculation statistics (OpenAI clients ignore it)."""

    acceptance_rate: float
    mean_accepted_length: float
    target_calls: int
    draft_tokens: int
    accepted_tokens: int
    seed: int | None  # the random seed the request sampled with (null: greedy): send it back to reproduce a sample


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprobEntry(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[TokenLogprobEntry]


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class CalledFunctionOut(BaseModel):
    name: str
    arguments: str  # JSON text


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"]
    function: CalledFunctionOut


class AssistantMessage(BaseModel):
    role: Literal["assistant"]
    content: str | None  # None: an answer of calls alone
    tool_calls: list[ToolCallOut] | None = None  # with tools, when the answer called them (serve/tool_calls.py)


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    finish_reason: Literal["stop", "length", "tool_calls"]
    logprobs: ChatLogprobs | None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    speculative: SpeculativeStats


class CompletionChoice(BaseModel):
    index: int
    text: str
    finish_reason: Literal["stop", "length"]
    logprobs: CompletionLogprobs | None


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage
    speculative: SpeculativeStats


class LmiDetails(BaseModel):
    finish_reason: str
    generated_tokens: int | None
    inputs: str | None


class LmiResponse(BaseModel):
    generated_text: str
    details: LmiDetails | None = None
    speculative: SpeculativeStats


class ModelCard(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None


class DetokenizeResponse(BaseModel):
    prompt: str


class Health(BaseModel):
    status: Literal["ok", "draining"]
    queue_depth: int | None = None
    running: int | None = None


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def _invocation_body() -> dict[str, Any]:
    """One of the three bodies, each without the keys that take precedence over its own (the server's rule)."""
    keys = list(INVOCATION_BODIES)
    return {
        "oneOf": [
            {"allOf": [_ref(model), *({"not": {"required": [k]}} for k in keys[:i])]} if i else _ref(model)
            for i, model in enumerate(INVOCATION_BODIES.values())
        ]
    }


REQUEST_BODIES: dict[str, dict[str, Any]] = {
    "chat": _ref(ChatCompletionBody),
    "completion": _ref(CompletionBody),
    "invocations": _invocation_body(),
    # a body with `messages` is a chat body (serve/tokens.py), any other a completions body
    "tokenize": {
        "oneOf": [
            _ref(TokenizeChatBody),
            {"allOf": [_ref(TokenizeCompletionBody), {"not": {"required": ["messages"]}}]},
        ]
    },
    "detokenize": _ref(DetokenizeBody),
}
ANSWERS: dict[str, type[BaseModel] | tuple[type[BaseModel], ...]] = {
    "chat": ChatCompletion,
    "completion": Completion,
    "invocations": (ChatCompletion, Completion, LmiResponse),
    "tokenize": TokenizeResponse,
    "detokenize": DetokenizeResponse,
}
STREAMS = {
    "chat": ["text/event-stream"],
    "completion": ["text/event-stream"],
    "invocations": ["text/event-stream", "application/jsonlines"],
}  # with `stream: true` (jsonlines: LMI)
TOKEN_ERRORS = {
    400: "a bad body: every problem named (field, value, rule, fix); a token id outside the vocabulary",
    401: "a missing or wrong API key",
    404: "an unknown model",
    413: "a body over 1 MiB",
    415: "a body that is not JSON",
}
STREAM_SCHEMAS = {  # OpenAPI 3.1: an event stream's schema describes one event, as parsed (its `data` text)
    "text/event-stream": {
        "type": "object",
        "required": ["data"],
        "description": "one SSE event: a chunk as JSON (docs/serving.md), an error body, or `[DONE]` last",
        "properties": {"data": {"type": "string", "pattern": "^(\\{.*\\}|\\[DONE\\])$"}},
    },
    "application/jsonlines": {"type": "string", "description": "one JSON object a line (LMI's stream)"},
}
TOKEN_BODIES = ("TokenizeChatBody", "TokenizeCompletionBody", "DetokenizeBody")
BUDGETS = (  # and min_tokens, which may not pass the budget
    ("ChatCompletionBody", "max_tokens"),
    ("ChatCompletionBody", "max_completion_tokens"),
    ("ChatCompletionBody", "min_tokens"),
    ("CompletionBody", "max_tokens"),
    ("CompletionBody", "min_tokens"),
    ("LmiParameters", "max_new_tokens"),
)
GENERATION_ERRORS = {
    400: "a bad body: every problem named (field, value, rule, fix)",
    401: "a missing or wrong API key",
    404: "an unknown model",
    413: "a body over 1 MiB",
    415: "a body that is not JSON",
    503: "the queue is full or the server drains (Retry-After)",
    504: "request_timeout passed",
    500: "the generation failed although the request was valid",
}


def route(kind: str) -> dict[str, Any]:
    """Keyword arguments of a route decorator: its request body (the server parses it itself, with a size cap)
    and its answers."""
    if kind in ("tokenize", "detokenize"):
        body = {"required": True, "content": {"application/json": {"schema": REQUEST_BODIES[kind]}}}
        token_answers: dict[int | str, Any] = {200: {"model": ANSWERS[kind], "description": "the answer"}}
        token_answers.update(
            {status: {"model": ErrorResponse, "description": why} for status, why in TOKEN_ERRORS.items()}
        )
        return {"openapi_extra": {"requestBody": body}, "responses": token_answers}
    if kind in REQUEST_BODIES:
        body = {"required": True, "content": {"application/json": {"schema": REQUEST_BODIES[kind]}}}
        answer = ANSWERS[kind]
        streams = {media: {"schema": STREAM_SCHEMAS[media]} for media in STREAMS[kind]}
        ok: dict[str, Any] = (
            {"model": answer, "content": streams}
            if isinstance(answer, type)
            else {"content": {"application/json": {"schema": {"oneOf": [_ref(m) for m in answer]}}, **streams}}
        )
        ok["description"] = f"the answer; with `stream: true`, {' or '.join(STREAMS[kind])}"
        responses: dict[int | str, Any] = {200: ok}
        responses.update(
            {status: {"model": ErrorResponse, "description": why} for status, why in GENERATION_ERRORS.items()}
        )
        return {"openapi_extra": {"requestBody": body}, "responses": responses}
    simple: dict[str, dict[int | str, Any]] = {
        "models": {200: {"model": ModelList, "description": "the served model"}},
        "model": {
            200: {"model": ModelCard, "description": "the served model"},
            404: {"model": ErrorResponse, "description": "another model id"},
        },
        "health": {
            200: {"model": Health, "description": "serving"},
            503: {"model": Health, "description": "draining after SIGTERM"},
        },
        "metrics": {
            200: {"description": "Prometheus text format", "content": {"text/plain": {"schema": {"type": "string"}}}}
        },
        "page": {200: {"description": "the playground page"}},
    }
    return {"responses": simple[kind]}


# a control -> a request that asks for it, and the API fields that ask for it with the values that ask for nothing
CONTROL_FIELDS: dict[str, tuple[RequestControls, dict[str, list[Any]]]] = {
    "grammar": (
        RequestControls(grammar=Grammar("json_object", "", "response_format")),
        {
            "response_format": [None, {"type": "text"}],
            "structured_outputs": [None],
            "guided_json": [None],
            "guided_regex": [None],
            "guided_choice": [None],
            "guided_grammar": [None],
            "grammar": [None],  # TGI's, in LMI's parameters
            "tool_choice": [None, "none", "auto"],  # required and a named function are constrained
            "strict": [None, False],  # a tool's: strict tools under auto are constrained (FunctionDef)
        },
    ),
    "logit_bias": (RequestControls(logit_bias=((0, 1.0),)), {"logit_bias": [None, {}]}),
    "min_tokens": (RequestControls(min_tokens=1), {"min_tokens": [0]}),
    "ignore_eos": (RequestControls(ignore_eos=True), {"ignore_eos": [False]}),
    "stop_token_ids": (RequestControls(stop_token_ids=(0,)), {"stop_token_ids": [None, []]}),
    "repetition_penalty": (RequestControls(repetition_penalty=1.1), {"repetition_penalty": [None, 1]}),
    "presence_penalty": (RequestControls(presence_penalty=0.5), {"presence_penalty": [None, 0]}),
    "frequency_penalty": (RequestControls(frequency_penalty=0.5), {"frequency_penalty": [None, 0]}),
    "min_p": (RequestControls(min_p=0.1), {"min_p": [None, 0]}),
}


def refused_controls(pipeline: ServedPipeline) -> dict[str, list[Any]]:
    """The API fields of the controls `pipeline` refuses -> the values that still pass (those that ask for nothing)."""
    refused: dict[str, list[Any]] = {}
    for asks, fields in CONTROL_FIELDS.values():
        if pipeline.controls_problems(asks):
            refused.update(fields)
    return refused


def document(
    app: FastAPI,
    model_name: str,
    largest_budget: int,
    vocab_size: int,
    refused: dict[str, list[Any]],
    capacity: int,
) -> dict[str, Any]:
    """FastAPI's document for the routes, plus the request bodies' schemas and this server's own limits (built once,
    then cached)."""
    if app.openapi_schema:
        return app.openapi_schema
    doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    components = doc.setdefault("components", {}).setdefault("schemas", {})
    extra = (
        ChatCompletion,
        Completion,
        LmiResponse,
        ChatCompletionBody,
        CompletionBody,
        LmiBody,
        TokenizeChatBody,
        TokenizeCompletionBody,
        DetokenizeBody,
    )
    for model in extra:
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}", mode="validation")
        components.update(schema.pop("$defs", {}))
        components[model.__name__] = schema
    for body in ("ChatCompletionBody", "CompletionBody", *TOKEN_BODIES):  # any other name is a 404
        _branch(components[body]["properties"]["model"], "string")["enum"] = [model_name]
    card = doc["paths"]["/v1/models/{model_id}"]["get"]
    for parameter in card["parameters"]:
        parameter["schema"]["enum"] = [model_name]
    card["responses"].pop("422", None)  # FastAPI's for a path parameter: any text is a model id, answered 200 or 404
    components["DetokenizeBody"]["properties"]["tokens"]["items"]["maximum"] = vocab_size - 1
    for body, name in BUDGETS:  # a longer prompt leaves less: the 400 says how much
        if name in components[body]["properties"] and name not in refused:
            _branch(components[body]["properties"][name], "integer")["maximum"] = largest_budget
    for body in ("ChatCompletionBody", "CompletionBody", "LmiParameters", "FunctionDef"):
        fields = components[body]["properties"]
        for name, passing in refused.items():
            if name in fields and not fields[name].get(REFUSED):  # a field refused anyway keeps its own values
                fields[name] = {"enum": passing, "description": "not supported by this server's engine"}
    for body in ("ChatCompletionBody", "CompletionBody"):
        _token_ids_within(components[body]["properties"], vocab_size)
        choices = components[body]["properties"]["n"]  # each choice is a row: the server holds `capacity` at once
        choices["maximum"] = min(choices["maximum"], capacity)
    app.openapi_schema = doc
    return doc


def _token_ids_within(fields: dict[str, Any], vocab_size: int) -> None:
    """Token ids lie in the vocabulary: a prompt's, stop_token_ids and logit_bias's keys (as decimal text)."""
    for item in _integer_items(fields.get("prompt", {})) + _integer_items(fields["stop_token_ids"]):
        item["maximum"] = vocab_size - 1
    for branch in fields["logit_bias"].get("anyOf", []):
        if branch.get("type") == "object":
            branch["propertyNames"] = {"pattern": f"^{decimal_pattern(vocab_size - 1)}$"}


def _integer_items(schema: dict[str, Any]) -> list[dict[str, Any]]:
    """The integer schemas of array items anywhere in `schema`'s branches (a prompt: ids, or a list of them)."""
    found: list[dict[str, Any]] = []
    for branch in schema.get("anyOf", schema.get("oneOf", [schema])):
        items = branch.get("items", {}) if branch.get("type") == "array" else {}
        found += [items] if items.get("type") == "integer" else _integer_items(items) if items else []
    return found


def decimal_pattern(largest: int) -> str:
    """A regular expression for the decimal numbers 0..largest, without leading zeros."""
    digits = str(largest)
    shorter = [f"[1-9][0-9]{{{n - 1}}}" if n > 1 else "[0-9]" for n in range(1, len(digits))]
    same_length, prefix = [], ""
    for i, digit in enumerate(digits):
        low = "1" if i == 0 and len(digits) > 1 else "0"
        rest = len(digits) - i - 1
        if int(digit) > int(low):
            tail = f"[0-9]{{{rest}}}" if rest else ""
            same_length.append(f"{prefix}[{low}-{int(digit) - 1}]{tail}")
        prefix += digit
    return "(?:" + "|".join(shorter + same_length + [digits]) + ")"


def _branch(prop: dict[str, Any], json_type: str) -> dict[str, Any]:
    """The schema of one JSON type within an optional field's `anyOf`."""
    return next(b for b in prop.get("anyOf", [prop]) if b.get("type") == json_type)
