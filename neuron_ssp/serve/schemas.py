"""Request bodies -> one `GenerationRequest`: OpenAI chat/completions (vLLM's field set) and LMI/TGI.

Types are checked by pydantic; the value rules (temperature >= 0, top_p in (0, 1], n = 1, ...) are
checked here so that every problem of a body is reported at once, each naming field, value, rule, fix.
Unknown fields are accepted and ignored, as OpenAI's and vLLM's servers do.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from neuron_ssp.errors import Problem
from neuron_ssp.serve.errors import ApiError

MAX_STOP_STRINGS = 4  # OpenAI's limit


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")


class TextPart(_Body):
    type: Literal["text"]
    text: str


class ChatMessage(_Body):
    role: Literal["system", "user", "assistant", "developer"]
    content: str | list[TextPart]


class StreamOptions(_Body):
    include_usage: bool = False


class _Sampling(_Body):
    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None  # extra field (vLLM's too): not in OpenAI's schema
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1


class ChatCompletionBody(_Sampling):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None


class CompletionBody(_Sampling):
    prompt: str | list[str]


class LmiParameters(_Body):
    """SageMaker LMI (DJL Serving) / TGI `parameters`; LMI <= 0.31 samples only with do_sample."""

    max_new_tokens: int | None = None
    do_sample: bool | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: list[str] | None = None  # TGI
    stop_sequences: list[str] | None = None  # LMI
    details: bool = False


class LmiBody(_Body):
    inputs: str
    parameters: LmiParameters = LmiParameters()
    stream: bool = False


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


def parse_json(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object, or a 400 that says where it stopped parsing."""
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        where = f" at line {exc.lineno}, column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else ""
        snippet = raw[:80].decode("utf-8", "replace")
        raise ApiError(400, Problem("body", snippet, f"not valid JSON{where}",
                                    "send a JSON object with Content-Type: application/json")) from None
    if not isinstance(data, dict):
        raise ApiError(400, Problem("body", data, "must be a JSON object", 'send an object such as '
                                    '{"model": ..., "messages": [{"role": "user", "content": "Hi"}]}'))
    return data


def chat_request(data: dict[str, Any]) -> GenerationRequest:
    body = _validate(ChatCompletionBody, data)
    problems = _sampling_problems(body)
    if not body.messages:
        problems.append(Problem("messages", [], "must hold at least one message",
                                'send [{"role": "user", "content": "..."}]'))
    _raise(problems)
    messages = [{"role": m.role, "content": m.content if isinstance(m.content, str)
                 else "".join(p.text for p in m.content)} for m in body.messages]
    request = _common("chat", body)
    request.messages = messages
    request.max_tokens = body.max_completion_tokens or body.max_tokens
    return request


def completion_request(data: dict[str, Any]) -> GenerationRequest:
    body = _validate(CompletionBody, data)
    problems = _sampling_problems(body)
    prompts = [body.prompt] if isinstance(body.prompt, str) else body.prompt
    if len(prompts) != 1:
        problems.append(Problem("prompt", body.prompt, "exactly one prompt per request (speculation runs batch 1)",
                                "send a single string; send one request per prompt"))
    _raise(problems)
    request = _common("completion", body)
    request.prompt = prompts[0]
    return request


def lmi_request(data: dict[str, Any]) -> GenerationRequest:
    body = _validate(LmiBody, data)
    p = body.parameters
    sample = p.do_sample if p.do_sample is not None else bool(p.temperature)  # LMI 0.32 infers it
    request = GenerationRequest("lmi", prompt=body.inputs, max_tokens=p.max_new_tokens,
                                temperature=(p.temperature if p.temperature is not None else 1.0) if sample else 0.0,
                                top_p=p.top_p, top_k=p.top_k, seed=p.seed, stop=(p.stop_sequences or p.stop or []),
                                stream=body.stream, details=p.details)
    _raise(_value_problems(request, prefix="parameters."))
    return request


def is_lmi_body(data: dict[str, Any]) -> bool:
    return "inputs" in data


def _common(kind: Literal["chat", "completion"], body: _Sampling) -> GenerationRequest:
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    return GenerationRequest(kind, model=body.model, max_tokens=body.max_tokens, temperature=body.temperature,
                             top_p=body.top_p, top_k=body.top_k, seed=body.seed, stop=stop, stream=body.stream,
                             include_usage=bool(body.stream_options and body.stream_options.include_usage))


def _sampling_problems(body: _Sampling) -> list[Problem]:
    problems = _value_problems(_common("completion", body))
    if body.n != 1:
        problems.append(Problem("n", body.n, "only n = 1 is supported: speculative sampling runs one sequence "
                                "at a time (batch 1)", "leave n out or send n = 1; send one request per completion"))
    if isinstance(body, ChatCompletionBody) and body.max_completion_tokens is not None \
            and body.max_completion_tokens < 1:
        problems.append(Problem("max_completion_tokens", body.max_completion_tokens, "must be >= 1",
                                "send at least 1, or leave it out for the server's default"))
    return problems


def _value_problems(r: GenerationRequest, prefix: str = "") -> list[Problem]:
    names = {"max_tokens": "max_new_tokens"} if prefix else {}
    checks = [
        ("max_tokens", r.max_tokens is not None and r.max_tokens < 1, "must be >= 1",
         "send at least 1, or leave it out for the server's default"),
        ("temperature", r.temperature is not None and r.temperature < 0, "must be >= 0 (0 = greedy)",
         "send 0 for greedy decoding or a positive temperature"),
        ("top_p", r.top_p is not None and not 0 < r.top_p <= 1, "must be in (0, 1]",
         "send a value above 0 and at most 1 (1 = off)"),
        ("top_k", r.top_k is not None and r.top_k < 0, "must be >= 0 (0 = off)", "send 0 or a positive integer"),
        ("stop", len(r.stop) > MAX_STOP_STRINGS, f"at most {MAX_STOP_STRINGS} stop strings",
         f"send up to {MAX_STOP_STRINGS}"),
        ("stop", any(s == "" for s in r.stop), "a stop string must not be empty", "remove the empty string"),
    ]
    return [Problem(prefix + names.get(name, name), r.stop if name == "stop" else getattr(r, name), rule, fix)
            for name, bad, rule, fix in checks if bad]


def _validate(model: type[_Body], data: dict[str, Any]) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ApiError(400, _merge([_problem(err) for err in exc.errors()])) from None


def _problem(err: Any) -> Problem:
    where = ".".join(str(p) for p in err["loc"] if not _union_tag(str(p)))
    if err["type"] == "missing":
        return Problem(where, None, "required field is missing", f"add `{where}` to the body")
    return Problem(where, err.get("input"), err["msg"].lower(), f"send {where} with the right type")


def _union_tag(part: str) -> bool:
    """pydantic names the branch of a union in `loc` (`str`, `list[str]`): not a field."""
    return part in {"str", "int", "float", "bool"} or "[" in part or part.startswith("function-")


def _merge(problems: list[Problem]) -> list[Problem]:
    """A field that fails several union branches (str | list) is reported once."""
    seen: dict[str, Problem] = {}
    for problem in problems:
        seen.setdefault(problem.field, problem)
    return list(seen.values())


def _raise(problems: list[Problem]) -> None:
    if problems:
        raise ApiError(400, problems)
