"""Request bodies -> one `GenerationRequest`: OpenAI chat/completions (vLLM's field set) and LMI/TGI.

Types are checked by pydantic (finite numbers, a seed that fits 64 bits, text that is valid Unicode);
the value rules (temperature >= 0, top_p in (0, 1], n = 1, ...) are checked here so that every problem
of a body is reported at once, each naming field, value, rule, fix. Unknown fields are accepted and
ignored, as OpenAI's and vLLM's servers do, except those that would change the answer and are not
supported (tools, response_format): those are refused rather than silently ignored. The same models
describe the bodies in /openapi.json.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from neuron_ssp.errors import Problem
from neuron_ssp.serve.errors import ApiError

MAX_STOP_STRINGS = 4  # OpenAI's limit
MAX_TOP_LOGPROBS = 20  # OpenAI's limit for chat (completions: 5); vLLM's default max_logprobs
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1  # vLLM's seed bounds (torch.long); torch seeds take any of them
NOT_SUPPORTED = ("tools", "tool_choice", "functions", "function_call", "response_format")


def _unicode(text: str) -> str:
    """JSON may escape a lone surrogate ("\\ud800"): not text a tokenizer can encode or a reply can hold."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"holds a lone surrogate at character {exc.start}: not valid Unicode text") from None
    return text


Text = Annotated[str, AfterValidator(_unicode)]
Seed = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)


class TextPart(_Body):
    type: Literal["text"]
    text: Text


class ChatMessage(_Body):
    role: Literal["system", "user", "assistant", "developer"]
    content: Text | list[TextPart]


class StreamOptions(_Body):
    include_usage: bool = False


class _Sampling(_Body):
    model: Text | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = Field(None, description="extra field (vLLM's too): 0 or -1 = off")
    seed: Seed | None = None
    stop: Text | list[Text] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = Field(None, description="only with stream: true")
    n: int = 1
    tools: Any = Field(None, description="not supported: refused")
    tool_choice: Any = Field(None, description="not supported: refused unless 'none'")
    functions: Any = Field(None, description="not supported: refused")
    function_call: Any = Field(None, description="not supported: refused unless 'none'")
    response_format: Any = Field(None, description="not supported: refused unless {'type': 'text'}")


class ChatCompletionBody(_Sampling):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, description=f"0..{MAX_TOP_LOGPROBS}, with logprobs: true")


class CompletionBody(_Sampling):
    prompt: Text | list[Text]
    logprobs: int | None = Field(None, description=f"0..{MAX_TOP_LOGPROBS}: the most likely tokens per position")


class LmiParameters(_Body):
    """SageMaker LMI (DJL Serving) / TGI `parameters`; LMI <= 0.31 samples only with do_sample."""

    max_new_tokens: int | None = None
    do_sample: bool | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: Seed | None = None
    stop: list[Text] | None = None  # TGI
    stop_sequences: list[Text] | None = None  # LMI
    details: bool = False


class LmiBody(_Body):
    inputs: Text
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
    logprobs: bool = False
    top_logprobs: int = 0  # alternatives per position, with logprobs


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
    if body.top_logprobs is not None and not body.logprobs:
        problems.append(Problem("top_logprobs", body.top_logprobs, "needs logprobs: true (OpenAI's rule)",
                                "send logprobs: true with it, or leave top_logprobs out"))
    problems += _top_logprobs_problems("top_logprobs", body.top_logprobs)
    _raise(problems)
    messages = [{"role": m.role, "content": m.content if isinstance(m.content, str)
                 else "".join(p.text for p in m.content)} for m in body.messages]
    request = _common("chat", body)
    request.messages = messages
    request.max_tokens = body.max_completion_tokens or body.max_tokens
    request.logprobs, request.top_logprobs = body.logprobs, body.top_logprobs or 0
    return request


def completion_request(data: dict[str, Any]) -> GenerationRequest:
    body = _validate(CompletionBody, data)
    problems = _sampling_problems(body)
    prompts = [body.prompt] if isinstance(body.prompt, str) else body.prompt
    if len(prompts) != 1:
        problems.append(Problem("prompt", body.prompt, "exactly one prompt per request (speculation runs batch 1)",
                                "send a single string; send one request per prompt"))
    problems += _top_logprobs_problems("logprobs", body.logprobs)
    _raise(problems)
    request = _common("completion", body)
    request.prompt = prompts[0]
    request.logprobs, request.top_logprobs = body.logprobs is not None, body.logprobs or 0
    return request


def lmi_request(data: dict[str, Any]) -> GenerationRequest:
    body = _validate(LmiBody, data)
    p = body.parameters
    sample = p.do_sample if p.do_sample is not None else bool(p.temperature)  # LMI 0.32 infers it
    request = GenerationRequest("lmi", prompt=body.inputs, max_tokens=p.max_new_tokens,
                                temperature=(p.temperature if p.temperature is not None else 1.0) if sample else 0.0,
                                top_p=p.top_p, top_k=_top_k(p.top_k), seed=p.seed,
                                stop=(p.stop_sequences or p.stop or []), stream=body.stream, details=p.details)
    _raise(_value_problems(request, prefix="parameters."))
    return request


def is_lmi_body(data: dict[str, Any]) -> bool:
    return "inputs" in data


def _common(kind: Literal["chat", "completion"], body: _Sampling) -> GenerationRequest:
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    return GenerationRequest(kind, model=body.model, max_tokens=body.max_tokens, temperature=body.temperature,
                             top_p=body.top_p, top_k=_top_k(body.top_k), seed=body.seed, stop=stop, stream=body.stream,
                             include_usage=bool(body.stream_options and body.stream_options.include_usage))


def _top_k(value: int | None) -> int | None:
    return 0 if value == -1 else value  # -1 is vLLM's "off", and many clients send it


def _sampling_problems(body: _Sampling) -> list[Problem]:
    problems = _value_problems(_common("completion", body)) + _unsupported_problems(body)
    if body.stream_options is not None and not body.stream:
        problems.append(Problem("stream_options", body.stream_options.model_dump(), "only allowed with stream: true "
                                "(as vLLM's server rules)", "send stream: true, or leave stream_options out"))
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
        ("top_k", r.top_k is not None and r.top_k < 0, "must be >= 0, or -1 (0 and -1 = off)",
         "send 0 or a positive integer"),
        ("stop", len(r.stop) > MAX_STOP_STRINGS, f"at most {MAX_STOP_STRINGS} stop strings",
         f"send up to {MAX_STOP_STRINGS}"),
        ("stop", any(s == "" for s in r.stop), "a stop string must not be empty", "remove the empty string"),
    ]
    return [Problem(prefix + names.get(name, name), r.stop if name == "stop" else getattr(r, name), rule, fix)
            for name, bad, rule, fix in checks if bad]


def _unsupported_problems(body: _Sampling) -> list[Problem]:
    """Fields that would change the answer and that this server cannot honour: refused, not ignored."""
    harmless = {"tool_choice": "none", "function_call": "none", "response_format": {"type": "text"}}
    return [Problem(name, value, "not supported by this server: speculative sampling here returns plain text "
                    "(no tool calls, no structured output)", f"leave {name} out")
            for name in NOT_SUPPORTED if (value := getattr(body, name)) is not None and value != harmless.get(name)]


def _top_logprobs_problems(name: str, value: int | None) -> list[Problem]:
    if value is None or 0 <= value <= MAX_TOP_LOGPROBS:
        return []
    return [Problem(name, value, f"must be in 0..{MAX_TOP_LOGPROBS}", f"send at most {MAX_TOP_LOGPROBS}")]


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
