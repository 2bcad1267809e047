"""Request bodies for /invocations and the text (and speculative stats) in what comes back.

Both engines take `{"inputs": ..., "parameters": {...}}` (LMI's and Hugging Face's shape); our server
also takes OpenAI chat/completions bodies. Answers come as one JSON object, as JSON lines, or as SSE
`data:` lines ending with `[DONE]`; `invoke_endpoint_with_response_stream` cuts them into payload
parts at arbitrary byte boundaries, so parts are joined before lines are split.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from neuron_ssp.errors import Problem, UsageError


@dataclass
class Answer:
    text: str = ""
    speculative: dict[str, Any] | None = None
    raw: list[Any] = field(default_factory=list)


def request_body(prompt: str | None, body: str | None, max_new_tokens: int, stream: bool) -> bytes:
    """--prompt builds the {"inputs", "parameters"} body; --body passes a JSON body through, checked."""
    if (prompt is None) == (body is None):
        raise UsageError(
            Problem(
                "--prompt/--body",
                None,
                "give a prompt or a JSON body (one of the two)",
                "e.g. --prompt 'Summarize: ...' or --body '{\"inputs\": \"...\"}'",
            )
        )
    if body is not None:
        try:
            parsed = json.loads(body)
        except json.JSONDecodeError as exc:
            raise UsageError(
                Problem(
                    "--body",
                    body[:80],
                    f"not JSON ({exc.msg} at {exc.pos})",
                    "quote the body in single quotes and use double quotes inside",
                )
            ) from None
        if stream and isinstance(parsed, dict):
            parsed.setdefault("stream", True)
        return json.dumps(parsed).encode()
    payload: dict[str, Any] = {"inputs": prompt, "parameters": {"max_new_tokens": max_new_tokens}}
    if stream:
        payload["stream"] = True
    return json.dumps(payload).encode()


def parse_answer(body: bytes) -> Answer:
    """One whole response body (invoke_endpoint)."""
    text = body.decode("utf-8", errors="replace").strip()
    try:
        objects = [json.loads(text)]
    except json.JSONDecodeError:
        objects = list(_objects(text.splitlines()))
    answer = Answer()
    for obj in objects:
        _merge(answer, obj)
    return answer


def stream_lines(parts: Iterable[bytes]) -> Iterator[str]:
    """Payload parts -> complete lines (a part may end in the middle of a line or a UTF-8 character)."""
    buffer = b""
    for part in parts:
        buffer += part
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            yield line.decode("utf-8", errors="replace")
    if buffer.strip():
        yield buffer.decode("utf-8", errors="replace")


def stream_pieces(lines: Iterable[str], answer: Answer) -> Iterator[str]:
    """Text increments, as they arrive; `answer` collects the whole text and the stats."""
    for obj in _objects(lines):
        before = len(answer.text)
        _merge(answer, obj)
        if len(answer.text) > before:
            yield answer.text[before:]


def _objects(lines: Iterable[str]) -> Iterator[Any]:
    for line in lines:
        line = line.strip()
        if line.startswith("data:"):
            line = line[len("data:") :].strip()
        if not line or line == "[DONE]":
            continue
        try:
            yield json.loads(line)
        except json.JSONDecodeError:
            yield {"generated_text": line}


def _merge(answer: Answer, obj: Any) -> None:
    answer.raw.append(obj)
    if isinstance(obj, list):
        for item in obj:
            _merge(answer, item)
        return
    if not isinstance(obj, dict):
        return
    if isinstance(obj.get("speculative"), dict):
        answer.speculative = obj["speculative"]
    answer.text += _text_of(obj)


def _text_of(obj: dict[str, Any]) -> str:
    if isinstance(obj.get("token"), dict):  # LMI / TGI streaming: {"token": {"text": ...}}
        return str(obj["token"].get("text") or "")
    if "generated_text" in obj and not obj.get("token"):
        return str(obj["generated_text"] or "")
    for choice in obj.get("choices") or []:
        delta = choice.get("delta") or {}
        message = choice.get("message") or {}
        return str(delta.get("content") or message.get("content") or choice.get("text") or "")
    return ""


def invoke(
    runtime: Any, name: str, body: bytes, *, stream: bool, on_text: Callable[[str], None], region: str = "?"
) -> Answer:
    """Call the endpoint; streamed text goes to `on_text` as it arrives."""
    from neuron_ssp.deploy.sagemaker.errors import sagemaker_errors

    request = {"EndpointName": name, "Body": body, "ContentType": "application/json"}
    with sagemaker_errors("sagemaker", region=region):
        if not stream:
            response = runtime.invoke_endpoint(Accept="application/json", **request)
            answer = parse_answer(response["Body"].read())
            on_text(answer.text)
            return answer
        response = runtime.invoke_endpoint_with_response_stream(**request)
        answer = Answer()
        parts = (event["PayloadPart"]["Bytes"] for event in response["Body"] if "PayloadPart" in event)
        for piece in stream_pieces(stream_lines(parts), answer):
            on_text(piece)
        return answer
