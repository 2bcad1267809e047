"""Request bodies and answers of /invocations: whole JSON, JSON lines, SSE, parts split mid-line."""

from __future__ import annotations

import json
from typing import Any

import deploy_fixtures
import pytest

from neuron_ssp.deploy.sagemaker.invoke import Answer, invoke, parse_answer, request_body, stream_lines, stream_pieces
from neuron_ssp.errors import UsageError

aws_sandbox = deploy_fixtures.aws_sandbox  # fake credentials, HTTP to loopback only


class FakeRuntime:
    """Plays sagemaker-runtime: the EventStream of a real response is an iterable of {'PayloadPart': ...}."""

    def __init__(self, parts: list[bytes] | None = None, body: bytes = b"") -> None:
        self.parts, self.body, self.calls = parts or [], body, []

    def invoke_endpoint_with_response_stream(self, **request: Any) -> dict[str, Any]:
        self.calls.append(request)
        return {"Body": iter([{"PayloadPart": {"Bytes": p}} for p in self.parts])}

    def invoke_endpoint(self, **request: Any) -> dict[str, Any]:
        import io

        self.calls.append(request)
        return {"Body": io.BytesIO(self.body)}


def test_prompt_body_is_inputs_and_parameters() -> None:
    body = json.loads(request_body("Hi", None, 64, stream=True))
    assert body == {"inputs": "Hi", "parameters": {"max_new_tokens": 64}, "stream": True}
    chat = json.loads(request_body(None, '{"messages": [{"role": "user", "content": "Hi"}]}', 64, stream=True))
    assert chat["stream"] is True and chat["messages"][0]["content"] == "Hi"


@pytest.mark.parametrize("prompt,body", [(None, None), ("a", "{}"), (None, "{not json")])
def test_bad_prompt_or_body_is_a_usage_error(prompt: str | None, body: str | None) -> None:
    with pytest.raises(UsageError) as err:
        request_body(prompt, body, 8, stream=False)
    assert err.value.problems[0].field in ("--prompt/--body", "--body")


def test_streamed_sse_split_mid_line_and_mid_utf8_character() -> None:
    text = 'data: {"choices": [{"delta": {"content": "Café"}}]}\n\ndata: {"choices": [{"delta": {"content": " ok"}}]}'
    raw = (
        text + '\n\ndata: {"choices": [{"delta": {}}], "speculative": {"acceptance_rate": 0.8}}\n\ndata: [DONE]\n\n'
    ).encode()
    cut = raw.index("é".encode()) + 1  # inside the two-byte é
    runtime = FakeRuntime(parts=[raw[:cut], raw[cut : cut + 20], raw[cut + 20 :]])
    pieces: list[str] = []
    answer = invoke(runtime, "ep", b"{}", stream=True, on_text=pieces.append)
    assert pieces == ["Café", " ok"] and answer.text == "Café ok"
    assert answer.speculative == {"acceptance_rate": 0.8}
    assert runtime.calls[0]["EndpointName"] == "ep" and runtime.calls[0]["ContentType"] == "application/json"


def test_lmi_jsonlines_stream() -> None:
    lines = ['{"token": {"id": 1, "text": "Hel"}}', '{"token": {"id": 2, "text": "lo"}, "generated_text": "Hello"}']
    answer = Answer()
    assert list(stream_pieces(stream_lines([("\n".join(lines)).encode()]), answer)) == ["Hel", "lo"]
    assert answer.text == "Hello" and answer.speculative is None


@pytest.mark.parametrize(
    "body,text",
    [
        ({"generated_text": "A", "speculative": {"mean_accepted_length": 2.5}}, "A"),
        ([{"generated_text": "B"}], "B"),
        ({"choices": [{"message": {"role": "assistant", "content": "C"}}], "speculative": {"target_calls": 3}}, "C"),
        ({"choices": [{"text": "D"}]}, "D"),
    ],
)
def test_whole_answers_of_both_engines(body: Any, text: str) -> None:
    answer = invoke(FakeRuntime(body=json.dumps(body).encode()), "ep", b"{}", stream=False, on_text=lambda _: None)
    assert answer.text == text
    assert answer.speculative == (body.get("speculative") if isinstance(body, dict) else None)
    assert parse_answer(json.dumps(body).encode()).text == text


def test_our_servers_lmi_style_stream_last_line_does_not_repeat_the_text() -> None:
    """neuron-ssp serve --sagemaker streams LMI JSON lines; the last adds generated_text and speculative."""
    lines = [
        json.dumps({"token": {"id": 5, "text": "Par", "log_prob": None, "origin": "target"}}),
        json.dumps({"token": {"id": 6, "text": "is", "log_prob": None, "origin": "draft"}}),
        json.dumps(
            {
                "token": {"id": -1, "text": "", "log_prob": None, "special_token": True},
                "generated_text": "Paris",
                "details": {"finish_reason": "stop"},
                "speculative": {"acceptance_rate": 0.5},
            }
        ),
    ]
    raw = ("\n".join(lines) + "\n").encode()
    answer = invoke(FakeRuntime(parts=[raw[:30], raw[30:]]), "ep", b"{}", stream=True, on_text=lambda _: None)
    assert answer.text == "Paris" and answer.speculative == {"acceptance_rate": 0.5}
