"""The API described: /openapi.json (and the /docs page FastAPI renders from it) for every route.

Request bodies come from the pydantic models the server validates with (serve/schemas.py); response
bodies and the error body from the models below, whose shapes serve/responses.py and serve/sagemaker.py
build (tests/test_serve_fuzz.py checks real answers against them). Client generators and API fuzzers
start from this document, as they do from vLLM's server.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from neuron_ssp.serve.schemas import ChatCompletionBody, CompletionBody, LmiBody

VERSION = "1"
DESCRIPTION = ("Speculative sampling behind OpenAI's chat and completions API and SageMaker's container contract. "
               "Every error is `{\"error\": {\"message\", \"type\", \"param\", \"code\"}}`; the message names the "
               "field, the value, the rule and the fix.")


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None
    code: int


class ErrorResponse(BaseModel):
    error: ErrorInfo


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int  # tokens whose text is returned (none past a stop string)
    total_tokens: int


class SpeculativeStats(BaseModel):
    """The extra field `speculative`: this request's speculation statistics (OpenAI clients ignore it)."""

    acceptance_rate: float
    mean_accepted_length: float
    target_calls: int
    draft_tokens: int
    accepted_tokens: int
    seed: int | None  # the random seed the request sampled with: send it back to reproduce a sample


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


class AssistantMessage(BaseModel):
    role: Literal["assistant"]
    content: str


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    finish_reason: Literal["stop", "length"]
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


class Health(BaseModel):
    status: Literal["ok", "draining"]
    queue_depth: int | None = None
    running: int | None = None


REQUEST_BODIES: dict[str, list[type[BaseModel]]] = {
    "chat": [ChatCompletionBody], "completion": [CompletionBody],
    "invocations": [ChatCompletionBody, CompletionBody, LmiBody]}
ANSWERS: dict[str, type[BaseModel] | tuple[type[BaseModel], ...]] = {
    "chat": ChatCompletion, "completion": Completion, "invocations": (ChatCompletion, Completion, LmiResponse)}
STREAMS = {"chat": "text/event-stream", "completion": "text/event-stream",
           "invocations": "text/event-stream or application/jsonlines (LMI)"}
GENERATION_ERRORS = {400: "a bad body: every problem named (field, value, rule, fix)",
                     401: "a missing or wrong API key", 404: "an unknown model", 413: "a body over 1 MiB",
                     415: "a body that is not JSON", 503: "the queue is full or the server drains (Retry-After)",
                     504: "request_timeout passed", 500: "the generation failed although the request was valid"}


def route(kind: str) -> dict[str, Any]:
    """Keyword arguments of a route decorator: its request body (the server parses it itself, with a size cap)
    and its answers."""
    if kind in REQUEST_BODIES:
        models = REQUEST_BODIES[kind]
        refs = [{"$ref": f"#/components/schemas/{m.__name__}"} for m in models]
        body = {"required": True, "content": {"application/json": {"schema": refs[0] if len(refs) == 1
                                                                   else {"oneOf": refs}}}}
        answer = ANSWERS[kind]
        ok: dict[str, Any] = {"model": answer} if isinstance(answer, type) else {
            "content": {"application/json": {"schema": {"oneOf": [{"$ref": f"#/components/schemas/{m.__name__}"}
                                                                  for m in answer]}}}}
        ok["description"] = f"the answer; with `stream: true`, {STREAMS[kind]}"
        responses: dict[int | str, Any] = {200: ok}
        responses.update({status: {"model": ErrorResponse, "description": why}
                          for status, why in GENERATION_ERRORS.items()})
        return {"openapi_extra": {"requestBody": body}, "responses": responses}
    simple: dict[str, dict[int | str, Any]] = {
        "models": {200: {"model": ModelList, "description": "the served model"}},
        "health": {200: {"model": Health, "description": "serving"},
                   503: {"model": Health, "description": "draining after SIGTERM"}},
        "metrics": {200: {"description": "Prometheus text format",
                          "content": {"text/plain": {"schema": {"type": "string"}}}}},
        "page": {200: {"description": "the playground page"}},
    }
    return {"responses": simple[kind]}


def document(app: FastAPI) -> dict[str, Any]:
    """FastAPI's document for the routes, plus the request bodies' schemas (built once, then cached)."""
    if app.openapi_schema:
        return app.openapi_schema
    doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    components = doc.setdefault("components", {}).setdefault("schemas", {})
    extra = (ChatCompletion, Completion, LmiResponse, ChatCompletionBody, CompletionBody, LmiBody)
    for model in extra:
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}", mode="validation")
        components.update(schema.pop("$defs", {}))
        components[model.__name__] = schema
    app.openapi_schema = doc
    return doc
