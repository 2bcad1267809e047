"""The HTTP contract at its edges, on the stand-in pipeline: bodies Python's JSON parser cannot take, the
connection after an error, fields the server cannot honour, strict integers, the `param` of the context
rule, seeds, request ids, 405's `Allow` header and the limits /openapi.json states (issue 33, item 5).
"""

from __future__ import annotations

import http.client
import json
import re
import sys
from urllib.parse import urlsplit

import httpx
import pytest
from serve_support import FakePipeline, running_server

from neuron_ssp.serve.schemas import MAX_STOP_STRINGS, MAX_TOP_LOGPROBS, NOT_BLANK

CHAT = {"messages": [{"role": "user", "content": "Hi"}]}
JSON = {"content-type": "application/json"}


def one_connection(url: str, bodies: list[bytes], path: str = "/v1/chat/completions") -> list[tuple[int, dict]]:
    """POST each body in turn on a single keep-alive connection: (status, JSON body) per answer."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    answers = []
    try:
        for body in bodies:
            conn.request("POST", path, body=body, headers=JSON)
            response = conn.getresponse()
            answers.append((response.status, json.loads(response.read())))
    finally:
        conn.close()
    return answers


GOOD = json.dumps({**CHAT, "max_tokens": 2}).encode()
HEAD = b'{"messages": [{"role": "user", "content": "Hi"}], '


@pytest.mark.parametrize(
    "body, words",
    [
        (HEAD + b'"max_tokens": 1' + b"0" * 5000 + b"}", [f"more than {sys.get_int_max_str_digits()} digits"]),
        (HEAD + b'"x": ' + b"[" * 5000 + b"]" * 5000 + b"}", ["nested more than", "levels"]),
    ],
)
def test_json_python_cannot_parse_is_a_400_and_the_connection_stays_usable(body, words):
    with running_server(FakePipeline()) as url:
        (status, error), (again, reply) = one_connection(url, [body, GOOD])
    assert status == 400 and error["error"]["param"] == "body", error
    assert all(word in error["error"]["message"] for word in words), error
    assert again == 200 and reply["choices"][0]["message"]["content"]


class BrokenEncoder(FakePipeline):
    """A bug on the request path: an exception no handler expects."""

    def encode_messages(self, messages, *args):
        if messages[0]["content"] == "boom":
            raise RuntimeError("a bug")
        return super().encode_messages(messages, *args)


def test_an_unexpected_failure_is_a_500_and_the_connection_stays_usable():
    boom = json.dumps({"messages": [{"role": "user", "content": "boom"}]}).encode()
    with running_server(BrokenEncoder()) as url:
        (status, error), (again, _) = one_connection(url, [boom, GOOD])
    assert status == 500 and "internal server error" in error["error"]["message"] and "a bug" not in str(error)
    assert again == 200


@pytest.mark.parametrize(
    "field, value, no_op",
    [
        ("echo", True, False),
        ("suffix", " and so on", ""),
        ("best_of", 3, 1),
        ("skip_special_tokens", False, True),
        ("bad_words", ["x"], []),
        ("truncate_prompt_tokens", 5, None),
    ],
)
def test_fields_that_would_change_the_answer_are_refused_unless_they_ask_for_nothing(field, value, no_op):
    with running_server(FakePipeline()) as url:
        refused = httpx.post(f"{url}/v1/completions", json={"prompt": "x", field: value})
        chat = httpx.post(f"{url}/v1/chat/completions", json={**CHAT, field: value})
        default = httpx.post(f"{url}/v1/completions", json={"prompt": "x", field: no_op})
        absent = httpx.post(f"{url}/v1/completions", json={"prompt": "x", field: None})
    for r in (refused, chat):
        assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
        assert "not supported" in r.json()["error"]["message"] and f"leave {field} out" in r.json()["error"]["message"]
    assert default.status_code == absent.status_code == 200, (default.text, absent.text)


@pytest.mark.parametrize(
    "field, value",
    [
        ("max_tokens", "3"),
        ("max_tokens", True),
        ("max_tokens", 3.5),
        ("n", "1"),
        ("n", True),
        ("seed", "7"),
        ("top_k", False),
    ],
)
def test_integers_are_strict(field, value):
    """JSON Schema's integers: 3.0 is one (as /openapi.json promises), "3" and true are not."""
    with running_server(FakePipeline()) as url:
        r = httpx.post(f"{url}/v1/chat/completions", json={**CHAT, field: value})
        integral = httpx.post(f"{url}/v1/chat/completions", json={**CHAT, field: 1.0})
    assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
    assert "must be an integer" in r.json()["error"]["message"]
    assert integral.status_code == 200, integral.text


@pytest.mark.parametrize(
    "body, param, sent, unsent",
    [
        ({"prompt": "x" * 200}, "prompt", ["'200 tokens'", "send max_tokens <= 57"], ["max_tokens = 128"]),
        ({"prompt": "x" * 300, "max_tokens": 10}, "prompt", ["'300 tokens'", "shorten the prompt"], ["max_tokens ="]),
        ({"prompt": "x" * 200, "max_tokens": 100}, "max_tokens", ["max_tokens = 100", "send max_tokens <= 57"], []),
        ({**CHAT, "messages": [{"role": "user", "content": "x" * 250}]}, "messages", ["'250 tokens'"], ["= 128"]),
        (
            {**CHAT, "max_completion_tokens": 100, "messages": [{"role": "user", "content": "x" * 200}]},
            "max_completion_tokens",
            ["max_completion_tokens = 100", "send max_completion_tokens <= 57"],
            [],
        ),
        ({"inputs": "x" * 250}, "inputs", ["'250 tokens'", "parameters.max_new_tokens <= 7"], ["= 128"]),
    ],
)
def test_a_prompt_over_the_context_names_the_field_the_client_sent_and_only_its_values(body, param, sent, unsent):
    path = "/invocations" if "inputs" in body else "/v1/chat/completions" if "messages" in body else "/v1/completions"
    with running_server(FakePipeline()) as url:
        r = httpx.post(f"{url}{path}", json=body)
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == param, error
    assert all(word in error["message"] for word in sent) and not any(w in error["message"] for w in unsent), error


def test_seed_is_reported_only_when_the_request_samples():
    pipeline = FakePipeline()
    with running_server(pipeline) as url:
        greedy = httpx.post(f"{url}/v1/chat/completions", json=CHAT).json()
        greedy_seeded = httpx.post(f"{url}/v1/chat/completions", json={**CHAT, "temperature": 0, "seed": 5}).json()
        sampled = httpx.post(f"{url}/v1/chat/completions", json={**CHAT, "temperature": 0.5, "seed": 5}).json()
        streamed = httpx.post(f"{url}/v1/completions", json={"prompt": "x", "stream": True}).text
        lmi = httpx.post(f"{url}/invocations", json={"inputs": "x"}).json()
    assert greedy["speculative"]["seed"] is None and greedy_seeded["speculative"]["seed"] is None
    assert sampled["speculative"]["seed"] == 5
    last = [json.loads(line[6:]) for line in streamed.split("\n\n") if line.startswith("data: {")][-1]
    assert last["speculative"]["seed"] is None and lmi["speculative"]["seed"] is None


def test_response_ids_are_unique_and_the_clients_request_id_is_echoed():
    mine = {"X-Request-Id": "client-7"}
    with running_server(FakePipeline()) as url:
        answers = [httpx.post(f"{url}/v1/chat/completions", json=CHAT, headers=mine) for _ in range(2)]
        refused = httpx.post(f"{url}/v1/chat/completions", json={**CHAT, "n": 2}, headers=mine)
        own = httpx.post(f"{url}/v1/completions", json={"prompt": "x"})
    ids = [r.json()["id"] for r in answers]
    assert ids[0] != ids[1] and all("client-7" not in i for i in ids), ids
    assert all(r.headers.get_list("x-request-id") == ["client-7"] for r in (*answers, refused))
    assert own.json()["id"] == f"cmpl-{own.headers['x-request-id']}"


@pytest.mark.parametrize(
    "method, path, allowed",
    [
        ("GET", "/v1/chat/completions", "POST"),
        ("PUT", "/invocations", "POST"),
        ("POST", "/v1/models", "GET"),
        ("DELETE", "/health", "GET"),
    ],
)
def test_405_names_the_allowed_methods(method, path, allowed):
    with running_server(FakePipeline()) as url:
        r = httpx.request(method, f"{url}{path}")
    assert r.status_code == 405 and allowed in r.headers["allow"], r.headers
    assert r.json()["error"]["code"] == 405


def _schema(doc: dict, name: str) -> dict:
    return doc["components"]["schemas"][name]["properties"]


def _branch(prop: dict, kind: str) -> dict:
    """The branch of an `anyOf` (an optional field) or a `oneOf` (the prompt's shapes) for one JSON type."""
    return next(b for b in prop.get("anyOf", prop.get("oneOf", [prop])) if b.get("type") == kind)


def test_openapi_states_the_limits_the_server_enforces():
    pipeline = FakePipeline(n_positions=256)
    with running_server(pipeline) as url:
        doc = httpx.get(f"{url}/openapi.json").json()
    chat, completion, lmi, parameters = (
        _schema(doc, n) for n in ("ChatCompletionBody", "CompletionBody", "LmiBody", "LmiParameters")
    )
    assert chat["messages"]["minItems"] == 1
    assert _branch(chat["temperature"], "number")["minimum"] == 0
    top_p = _branch(chat["top_p"], "number")
    assert (top_p["exclusiveMinimum"], top_p["maximum"]) == (0, 1)
    assert (chat["n"]["minimum"], chat["n"]["maximum"]) == (1, 24)  # serve.max_batch 8 + max_queue 16
    for prop in (
        chat["max_tokens"],
        chat["max_completion_tokens"],
        completion["max_tokens"],
        parameters["max_new_tokens"],
    ):  # a 1-token prompt leaves 256 of 256 positions
        assert (_branch(prop, "integer")["minimum"], _branch(prop, "integer")["maximum"]) == (1, 256)
    assert _branch(chat["top_logprobs"], "integer")["maximum"] == MAX_TOP_LOGPROBS
    assert _branch(completion["logprobs"], "integer")["maximum"] == MAX_TOP_LOGPROBS
    assert _branch(chat["stop"], "array")["maxItems"] == MAX_STOP_STRINGS
    assert _branch(completion["prompt"], "string")["pattern"] == lmi["inputs"]["pattern"] == NOT_BLANK
    assert _branch(completion["prompt"], "array")["maxItems"] == 1
    assert _branch(chat["model"], "string")["enum"] == ["fake-model"]
    assert (_branch(chat["frequency_penalty"], "number")["minimum"], chat["echo"]["enum"]) == (-2, [None, False])
    needs = doc["components"]["schemas"]["ChatCompletionBody"]["allOf"]
    assert {(r["if"]["required"][0], next(iter(r["then"]["properties"]))) for r in needs} == {
        ("stream_options", "stream"),
        ("top_logprobs", "logprobs"),
        ("continue_final_message", "add_generation_prompt"),
        ("tool_choice", "tools"),
    }
    ok = doc["paths"]["/v1/chat/completions"]["post"]["responses"]["200"]["content"]
    assert set(ok) == {"application/json", "text/event-stream"}
    assert "application/jsonlines" in doc["paths"]["/invocations"]["post"]["responses"]["200"]["content"]


def test_openapi_states_the_controls_an_engine_refuses_as_taking_only_their_no_ops():
    with running_server(FakePipeline(engine="fused")) as url:
        fused = _schema(httpx.get(f"{url}/openapi.json").json(), "ChatCompletionBody")
    with running_server(FakePipeline(n_positions=256)) as url:
        native = httpx.get(f"{url}/openapi.json").json()
    assert fused["frequency_penalty"]["enum"] == [None, 0] and fused["guided_json"]["enum"] == [None]
    assert fused["response_format"]["enum"] == [None, {"type": "text"}] and fused["min_tokens"]["enum"] == [0]
    chat, completion = _schema(native, "ChatCompletionBody"), _schema(native, "CompletionBody")
    assert "enum" not in chat["guided_json"] and _branch(chat["min_p"], "number")["maximum"] == 1
    ids = [b["items"] for b in completion["prompt"]["oneOf"] if b.get("items", {}).get("type") == "integer"]
    assert ids == [{"minimum": 0, "maximum": 0x10FFFF, "type": "integer"}]
    assert _branch(chat["stop_token_ids"], "array")["items"]["maximum"] == 0x10FFFF
    keys = _branch(chat["logit_bias"], "object")["propertyNames"]["pattern"]
    assert re.match(keys, "1114111") and not re.match(keys, "1114112") and not re.match(keys, "007")


def test_the_not_blank_pattern_is_pythons_white_space():
    """The prompt checks strip Python's white space: the pattern stated for prompts must refuse exactly it."""
    blank = re.compile(NOT_BLANK)
    assert all((blank.search(c) is None) == c.isspace() for c in map(chr, range(sys.maxunicode + 1)))


def test_temperature_above_2_is_refused_as_openai_and_vllm_refuse_it_and_top_k_0_is_off():
    """OpenAI's temperature is 0..2; vLLM 0.33.0 refuses above 2 as well (SamplingParams._verify_args,
    vllm/sampling_params.py:668-673). top_k 0 and -1 both mean off, as in vLLM (sampling_params.py:318-320)."""
    pipeline = FakePipeline()
    with running_server(pipeline) as url:
        hot = httpx.post(f"{url}/v1/chat/completions", json={**CHAT, "temperature": 2.5})
        lmi = httpx.post(f"{url}/invocations", json={"inputs": "x", "parameters": {"temperature": 3}})
        edge = httpx.post(f"{url}/v1/chat/completions", json={**CHAT, "temperature": 2, "seed": 1})
        off = httpx.post(f"{url}/v1/chat/completions", json={**CHAT, "top_k": 0})
        doc = httpx.get(f"{url}/openapi.json").json()
    assert hot.status_code == 400 and hot.json()["error"]["param"] == "temperature", hot.text
    assert "must be <= 2" in hot.json()["error"]["message"] and "OpenAI" in hot.json()["error"]["message"]
    assert lmi.status_code == 400 and lmi.json()["error"]["param"] == "parameters.temperature", lmi.text
    assert edge.status_code == off.status_code == 200
    assert pipeline.calls[-1]["sampling"].top_k == 0
    chat = _schema(doc, "ChatCompletionBody")
    assert _branch(chat["temperature"], "number")["maximum"] == 2
    assert "vLLM" in chat["temperature"]["description"] and "0 or -1" in chat["top_k"]["description"]
