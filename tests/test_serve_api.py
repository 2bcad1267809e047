"""The HTTP layer on a stand-in pipeline: bodies, SSE, errors, queue, timeout, disconnect, metrics, SIGTERM.

The same server on the embedded model, with the official openai client and a real browser, is in
tests/test_serve_embedded.py (slow).
"""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
from serve_support import FakePipeline, running_server

from neuron_ssp.errors import Problem, RuntimeProblem, UsageError

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hello"}]}
JSON = {"content-type": "application/json"}


def sse_events(text: str) -> list:
    lines = [line[len("data: ") :] for line in text.split("\n\n") if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_chat_non_stream_carries_usage_finish_reason_and_speculative_stats():
    with running_server(FakePipeline()) as url:
        r = httpx.post(f"{url}/v1/chat/completions", json=CHAT)
    body = r.json()
    assert r.status_code == 200 and r.headers["x-request-id"] and body["id"].endswith(r.headers["x-request-id"])
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "olleh"}
    assert body["choices"][0]["finish_reason"] == "stop"  # the fake ends with EOS
    usage = {
        "prompt_tokens": 5,
        "completion_tokens": 6,
        "total_tokens": 11,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    assert body["usage"] == usage
    assert set(body["speculative"]) == {
        "acceptance_rate",
        "mean_accepted_length",
        "target_calls",
        "draft_tokens",
        "accepted_tokens",
        "seed",
    }


def test_completion_stream_chunks_carry_token_origins_and_usage_when_asked():
    with running_server(FakePipeline(reply="abcdefg")) as url:
        r = httpx.post(
            f"{url}/v1/completions",
            json={"prompt": "x", "max_tokens": 7, "stream": True, "stream_options": {"include_usage": True}},
        )
    assert r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.text)
    tokens = [t for e in events if e["choices"] for t in e["speculative"]["tokens"]]
    assert "".join(t["text"] for t in tokens) == "".join(e["choices"][0]["text"] for e in events if e["choices"])
    # prefill token from the target, then steps of 2 accepted drafts + 1 target token
    assert [t["origin"] for t in tokens] == ["target", "draft", "draft", "target", "draft", "draft", "target"]
    assert events[-2]["choices"][0]["finish_reason"] == "length"
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 7
    assert all("usage" in e for e in events)


def test_chat_stream_opens_with_the_assistant_role_and_no_usage_unless_asked():
    with running_server(FakePipeline()) as url:
        r = httpx.post(f"{url}/v1/chat/completions", json={**CHAT, "stream": True})
    events = sse_events(r.text)
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events) == "olleh"
    assert not any("usage" in e for e in events)


def test_stop_string_is_never_sent_not_even_in_part():
    with running_server(FakePipeline(reply="one two STOP three")) as url:
        plain = httpx.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 30, "stop": ["STOP"]})
        streamed = httpx.post(
            f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 30, "stop": "STOP", "stream": True}
        )
    assert plain.json()["choices"][0] == {"index": 0, "finish_reason": "stop", "logprobs": None, "text": "one two "}
    assert "".join(e["choices"][0]["text"] for e in sse_events(streamed.text)) == "one two "


def test_sampling_fields_reach_the_pipeline_and_defaults_come_from_the_config():
    pipeline = FakePipeline()
    with running_server(pipeline) as url:
        httpx.post(
            f"{url}/v1/chat/completions",
            json={**CHAT, "temperature": 0.7, "top_p": 0.9, "top_k": 5, "seed": 3, "max_completion_tokens": 4},
        )
        httpx.post(f"{url}/v1/chat/completions", json=CHAT)
    first, second = pipeline.calls
    assert first["max_new_tokens"] == 4
    assert (
        first["sampling"].temperature,
        first["sampling"].top_p,
        first["sampling"].top_k,
        first["sampling"].seed,
    ) == (0.7, 0.9, 5, 3)
    assert second["sampling"] == pipeline.config.sampling
    assert second["max_new_tokens"] == pipeline.config.generation.max_new_tokens


def test_models_health_ping_and_playground_page():
    with running_server(FakePipeline()) as url:
        models = httpx.get(f"{url}/v1/models").json()
        assert models["data"][0]["id"] == "fake-model"
        assert httpx.get(f"{url}/health").status_code == 200
        assert httpx.get(f"{url}/ping").status_code == 200
        page = httpx.get(f"{url}/")
    assert page.status_code == 200 and "fake-model" in page.text
    assert "http://" not in page.text and "https://" not in page.text  # no external assets


LONG = "x" * 300


@pytest.mark.parametrize(
    "path, body, status, param, words",
    [
        ("/v1/chat/completions", b"{not json", 400, "body", ["not valid JSON", "line 1"]),
        ("/v1/chat/completions", b"[1, 2]", 400, "body", ["must be a JSON object"]),
        ("/v1/chat/completions", {"messages": "hi"}, 400, "messages", ["valid list"]),
        ("/v1/chat/completions", {**CHAT, "max_tokens": "many"}, 400, "max_tokens", ["must be an integer"]),
        ("/v1/chat/completions", {**CHAT, "temperature": -1}, 400, "temperature", ["must be >= 0", "Fix:"]),
        ("/v1/chat/completions", {**CHAT, "top_p": 0}, 400, "top_p", ["must be > 0", "nucleus sampling"]),
        ("/v1/chat/completions", {**CHAT, "top_p": 1.5}, 400, "top_p", ["must be <= 1", "Fix: send a value <= 1"]),
        ("/v1/chat/completions", {**CHAT, "n": 50}, 400, "n", ["must be <= 24", "each choice is a row of the batch"]),
        (
            "/v1/completions",
            {"prompt": LONG[:200], "max_tokens": 100},
            400,
            "max_tokens",
            [
                "a prompt of 200 tokens and max_new_tokens 100 write 299 cache positions, more than the 256",
                "send max_tokens <= 57",
            ],
        ),
        ("/v1/completions", {"prompt": LONG, "max_tokens": 10}, 400, "prompt", ["shorten the prompt"]),
        ("/v1/chat/completions", {**CHAT, "model": "gpt-4"}, 404, "model", ["no such model", "fake-model"]),
        ("/v1/completions", {"prompt": " "}, 400, "prompt", ["not white space"]),
        ("/invocations", {"something": 1}, 400, "body", ["inputs"]),
        ("/invocations", {"inputs": "hi", "parameters": {"top_p": 2}}, 400, "parameters.top_p", ["must be <= 1"]),
        ("/v1/nowhere", {}, 404, "path", ["not found"]),
    ],
)
def test_bad_requests_get_openai_error_bodies_that_name_field_value_rule_and_fix(path, body, status, param, words):
    with running_server(FakePipeline()) as url:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        r = httpx.post(f"{url}{path}", content=content, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == status
    assert error["param"] == param
    for word in words:
        assert word in error["message"]
    assert "Traceback" not in r.text and r.headers["x-request-id"]


def test_several_problems_are_reported_at_once():
    with running_server(FakePipeline()) as url:
        r = httpx.post(f"{url}/v1/chat/completions", json={**CHAT, "temperature": -1, "top_p": 3, "n": 500})
    message = r.json()["error"]["message"]
    assert all(f in message for f in ("temperature = -1", "top_p = 3", "n = 500"))


def test_the_n_positions_rule_is_the_clis():
    """Same rule text as `neuron-ssp generate` (generator.check_room), only the fix speaks to a client."""
    from neuron_ssp.errors import UsageError

    pipeline = FakePipeline()
    with pytest.raises(UsageError) as cli:
        pipeline.check_room(pipeline.encode(LONG), 10)
    with running_server(pipeline) as url:
        r = httpx.post(f"{url}/v1/completions", json={"prompt": LONG, "max_tokens": 10})
    assert cli.value.problems[0].rule in r.json()["error"]["message"]


def test_body_over_1_mib_is_413_with_or_without_content_length():
    big = json.dumps({"prompt": "x" * (1 << 20)}).encode()
    with running_server(FakePipeline()) as url:
        sized = httpx.post(f"{url}/v1/completions", content=big, headers=JSON)
        chunked = httpx.post(f"{url}/v1/completions", content=iter([big[:1000], big[1000:]]), headers=JSON)
    for r in (sized, chunked):
        assert r.status_code == 413 and "1 MiB" in r.json()["error"]["message"]


def test_api_key_is_required_on_v1_and_only_the_right_one_passes():
    with running_server(FakePipeline(), api_key="s3cret") as url:
        missing = httpx.post(f"{url}/v1/chat/completions", json=CHAT)
        wrong = httpx.post(f"{url}/v1/chat/completions", json=CHAT, headers={"Authorization": "Bearer s3cre"})
        right = httpx.post(f"{url}/v1/chat/completions", json=CHAT, headers={"Authorization": "Bearer s3cret"})
        ping = httpx.get(f"{url}/ping")
    assert missing.status_code == wrong.status_code == 401
    assert "Authorization: Bearer" in wrong.json()["error"]["message"] and "s3cre" not in wrong.text
    assert right.status_code == 200 and ping.status_code == 200


def test_a_wrong_key_of_the_right_length_is_refused_and_the_key_guards_invocations_unless_sagemaker():
    headers = {"Authorization": "Bearer s3cres"}  # same length as the key, last character wrong
    with running_server(FakePipeline(), api_key="s3cret") as url:
        wrong = httpx.post(f"{url}/v1/chat/completions", json=CHAT, headers=headers)
        invocations = httpx.post(f"{url}/invocations", json={"inputs": "x"})
        keyed = httpx.post(f"{url}/invocations", json={"inputs": "x"}, headers={"Authorization": "Bearer s3cret"})
    with running_server(FakePipeline(), api_key="s3cret", sagemaker=True) as url:
        behind_sagemaker = httpx.post(f"{url}/invocations", json={"inputs": "x"})
        still_v1 = httpx.post(f"{url}/v1/chat/completions", json=CHAT)
    assert wrong.status_code == 401 and "s3cre" not in wrong.text
    assert invocations.status_code == 401 and keyed.status_code == 200
    assert behind_sagemaker.status_code == 200 and still_v1.status_code == 401


def test_full_queue_answers_503_with_retry_after_and_nothing_hangs():
    pipeline = FakePipeline(reply="a" * 40, step_s=0.15, max_batch=1)  # a place frees after > FULL_WAIT_S
    results: list[httpx.Response] = []
    with running_server(pipeline, max_queue=1) as url:

        def call() -> None:
            results.append(httpx.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 40}, timeout=30))

        threads = [threading.Thread(target=call) for _ in range(5)]
        for t in threads:
            t.start()
            time.sleep(0.05)
        for t in threads:
            t.join(30)
        health = httpx.get(f"{url}/health")
    statuses = sorted(r.status_code for r in results)
    assert len(results) == 5 and statuses.count(200) == 2 and statuses.count(503) == 3, statuses
    refused = next(r for r in results if r.status_code == 503)
    assert refused.headers["retry-after"] == "1" and "queue is full" in refused.json()["error"]["message"]
    assert health.status_code == 200


def test_request_timeout_ends_cleanly_and_frees_the_slot():
    pipeline = FakePipeline(reply="a" * 200, step_s=0.05)
    with running_server(pipeline, request_timeout=0.5) as url:
        slow = httpx.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 200})
        assert pipeline.cancelled.wait(2)
        pipeline.reply = "ok"
        start = time.monotonic()
        fast = httpx.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 2})
    assert slow.status_code == 504 and "request_timeout" in slow.json()["error"]["message"]
    assert fast.status_code == 200 and time.monotonic() - start < 1.0


def test_client_disconnect_mid_stream_cancels_at_the_next_iteration():
    pipeline = FakePipeline(reply="a" * 400, step_s=0.05, n_positions=1024)
    with running_server(pipeline) as url:
        with httpx.stream(
            "POST", f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 400, "stream": True}
        ) as r:
            for _ in zip(range(3), r.iter_lines(), strict=False):
                pass
        assert pipeline.cancelled.wait(2)
        pipeline.reply = "ok"
        start = time.monotonic()
        assert httpx.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 2}).status_code == 200
        assert time.monotonic() - start < 1.0


def test_lmi_bodies_on_invocations_plain_and_streamed():
    pipeline = FakePipeline(reply="abcdef")
    with running_server(pipeline) as url:
        plain = httpx.post(
            f"{url}/invocations", json={"inputs": "x", "parameters": {"max_new_tokens": 6, "details": True}}
        )
        streamed = httpx.post(
            f"{url}/invocations", json={"inputs": "x", "parameters": {"max_new_tokens": 6}, "stream": True}
        )
        sampled = httpx.post(f"{url}/invocations", json={"inputs": "x", "parameters": {"do_sample": True}})
    assert plain.json()["generated_text"] == "abcdef"
    assert plain.json()["details"] == {"finish_reason": "length", "generated_tokens": 6, "inputs": "x"}
    assert streamed.headers["content-type"].startswith("application/jsonlines")
    lines = [json.loads(line) for line in streamed.text.splitlines()]
    assert "".join(line["token"]["text"] for line in lines) == "abcdef"
    assert lines[-1]["generated_text"] == "abcdef" and "generated_text" not in lines[0]
    assert sampled.status_code == 200 and pipeline.calls[-1]["sampling"].temperature == 1.0  # LMI: do_sample
    assert pipeline.calls[0]["sampling"].temperature == 0.0


def test_openai_bodies_on_invocations_stream_as_sse():
    with running_server(FakePipeline()) as url:
        chat = httpx.post(f"{url}/invocations", json=CHAT)
        streamed = httpx.post(f"{url}/invocations", json={"prompt": "abc", "stream": True})
    assert chat.json()["choices"][0]["message"]["content"] == "olleh"
    assert "".join(e["choices"][0]["text"] for e in sse_events(streamed.text)) == "cba"


def _samples(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_metrics_counters_match_the_requests_sent():
    with running_server(FakePipeline(reply="abcd")) as url:
        for _ in range(3):
            httpx.post(f"{url}/v1/completions", json={"prompt": "xy", "max_tokens": 4})
        httpx.post(f"{url}/v1/chat/completions", json={**CHAT, "temperature": -1})
        httpx.post(f"{url}/invocations", json={"inputs": "xy", "parameters": {"max_new_tokens": 4}})
        metrics = httpx.get(f"{url}/metrics")
    assert metrics.headers["content-type"].startswith("text/plain")
    m = _samples(metrics.text)
    assert m['neuron_ssp_requests_total{endpoint="/v1/completions",status="200"}'] == 3
    assert m['neuron_ssp_requests_total{endpoint="/v1/chat/completions",status="400"}'] == 1
    assert m['neuron_ssp_requests_total{endpoint="/invocations",status="200"}'] == 1
    assert m["neuron_ssp_prompt_tokens_total"] == 4 * 2
    assert m["neuron_ssp_generation_tokens_total"] == 4 * 4
    assert m["neuron_ssp_e2e_request_latency_seconds_count"] == 4
    assert m["neuron_ssp_time_to_first_token_seconds_count"] == 4
    assert m["neuron_ssp_accepted_tokens_per_target_call_count"] == 4  # "abcd": prefill "a", then one step "bcd"
    assert m["neuron_ssp_accepted_tokens_total"] == 4 * 2
    assert m["neuron_ssp_queue_depth"] == 0 and m["neuron_ssp_running_requests"] == 0


def test_a_client_that_gives_up_on_a_non_streamed_request_cancels_it():
    pipeline = FakePipeline(reply="a" * 400, step_s=0.05, n_positions=1024)
    with running_server(pipeline) as url:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 400}, timeout=0.5)
        assert pipeline.cancelled.wait(3)


def test_one_request_id_header_per_response():
    with running_server(FakePipeline()) as url:
        for r in (
            httpx.post(f"{url}/v1/chat/completions", json=CHAT),
            httpx.post(f"{url}/v1/chat/completions", json={**CHAT, "n": 2}),
            httpx.get(f"{url}/health", headers={"X-Request-Id": "mine-1"}),
        ):
            assert len(r.headers.get_list("x-request-id")) == 1
    assert r.headers["x-request-id"] == "mine-1"


def failing(error: Exception, at: str) -> FakePipeline:
    """A loop that fails as the real one does: its prefill raises ("join"), or a step sets the row's error."""
    pipeline = FakePipeline()
    pipeline.error, pipeline.error_at = error, at
    return pipeline


@pytest.mark.parametrize("at", ["join", "step"])
@pytest.mark.parametrize(
    "error, status",
    [
        (
            UsageError(Problem("speculation.acceptor", "greedy", "greedy needs temperature 0", "send temperature 0")),
            400,
        ),
        (
            RuntimeProblem(Problem("target logits", "nan", "the target produced non-finite logits", "check the model")),
            500,
        ),
    ],
)
def test_a_failed_generation_is_the_clients_fault_only_when_it_is_a_usage_error(error, status, at):
    with running_server(failing(error, at)) as url:
        reply = httpx.post(f"{url}/v1/completions", json={"prompt": "hi", "max_tokens": 4})
        follow_up = httpx.post(f"{url}/v1/completions", json={"prompt": "hi", "max_tokens": 4})
    assert reply.status_code == status
    assert error.problems[0].field in reply.json()["error"]["message"]
    assert follow_up.status_code == status  # the worker survived the failure and answers the next request


def test_completion_tokens_and_the_token_counter_stop_at_the_stop_string():
    """The fake commits 3 tokens per step: the tokens after a stop string in the same step are not returned,
    so they are not counted either."""
    with running_server(FakePipeline(reply="abcdSTOPxyz")) as url:
        r = httpx.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 11, "stop": "STOP"})
        metrics = _samples(httpx.get(f"{url}/metrics").text)
    assert r.json()["choices"][0]["text"] == "abcd"
    assert r.json()["usage"]["completion_tokens"] == 4
    assert metrics["neuron_ssp_generation_tokens_total"] == 4


@pytest.mark.parametrize(
    "raw, param, words",
    [
        (b'{"prompt": "x", "temperature": NaN}', "temperature", ["finite number"]),
        (b'{"prompt": "x", "top_p": Infinity}', "top_p", ["finite number"]),
        (b'{"prompt": "x", "seed": 99999999999999999999}', "seed", ["must be <= 9223372036854775807"]),
        (b'{"messages": [{"role": "user", "content": "\\ud800 hi"}]}', "messages.0.content", ["lone surrogate"]),
        (b'{"prompt": "x", "stop": ["\\udfff"]}', "stop.0", ["lone surrogate"]),
    ],
)
def test_values_that_used_to_reach_the_model_and_crash_are_400(raw, param, words):
    path = "/v1/chat/completions" if b"messages" in raw else "/v1/completions"
    with running_server(FakePipeline()) as url:
        r = httpx.post(f"{url}{path}", content=raw, headers=JSON)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    assert all(word in r.json()["error"]["message"] for word in words)


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", None])
def test_a_body_that_is_not_json_is_415(content_type):
    headers = {"content-type": content_type} if content_type else {}
    with running_server(FakePipeline()) as url:
        r = httpx.post(f"{url}/v1/completions", content=b'{"prompt": "x"}', headers=headers)
        ok = httpx.post(
            f"{url}/v1/completions",
            content=b'{"prompt": "x"}',
            headers={"content-type": "application/json; charset=utf-8"},
        )
    assert r.status_code == 415 and r.json()["error"]["param"] == "Content-Type"
    assert "application/json" in r.json()["error"]["message"]
    assert ok.status_code == 200


def test_every_error_body_has_the_same_shape_whoever_answers_it():
    """401 and 413 come from the middleware, 400/404/415 from the routes: one renderer for all."""
    with running_server(FakePipeline(), api_key="k") as url:
        key = {"Authorization": "Bearer k"}
        answers = [
            httpx.post(f"{url}/v1/completions", json={"prompt": "x"}),  # 401
            httpx.post(f"{url}/v1/completions", content=b"x" * (2 << 20), headers={**JSON, **key}),  # 413
            httpx.post(f"{url}/v1/completions", json={"prompt": ""}, headers=key),  # 400
            httpx.post(f"{url}/v1/completions", content=b"{}", headers={**key, "content-type": "text/plain"}),
            httpx.get(f"{url}/nowhere"),
        ]
    assert [r.status_code for r in answers] == [401, 413, 400, 415, 404]
    for r in answers:
        assert r.headers["content-type"] == "application/json"
        assert r.text == json.dumps(r.json(), separators=(",", ":"), ensure_ascii=False)  # rendered alike


def test_an_empty_lmi_inputs_is_refused_naming_inputs():
    with running_server(FakePipeline()) as url:
        r = httpx.post(f"{url}/invocations", json={"inputs": " ", "parameters": {"max_new_tokens": 4}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "inputs"


def test_top_k_minus_one_means_off_and_stream_options_need_stream():
    pipeline = FakePipeline()
    with running_server(pipeline) as url:
        off = httpx.post(f"{url}/v1/chat/completions", json={**CHAT, "top_k": -1})
        lmi = httpx.post(f"{url}/invocations", json={"inputs": "x", "parameters": {"top_k": -1}})
        lonely = httpx.post(f"{url}/v1/chat/completions", json={**CHAT, "stream_options": {"include_usage": True}})
    assert off.status_code == lmi.status_code == 200
    assert pipeline.calls[0]["sampling"].top_k == pipeline.calls[1]["sampling"].top_k == 0
    assert lonely.status_code == 400 and lonely.json()["error"]["param"] == "stream_options"


def test_a_sampled_request_without_seed_gets_a_fresh_one_and_reports_it():
    pipeline = FakePipeline()
    with running_server(pipeline) as url:
        bodies = [httpx.post(f"{url}/v1/chat/completions", json={**CHAT, "temperature": 0.8}).json() for _ in range(2)]
        given = httpx.post(f"{url}/v1/chat/completions", json={**CHAT, "temperature": 0.8, "seed": 42}).json()
    seeds = [b["speculative"]["seed"] for b in bodies]
    assert seeds[0] != seeds[1] and [c["sampling"].seed for c in pipeline.calls[:2]] == seeds
    assert given["speculative"]["seed"] == 42


def test_chat_logprobs_with_top_alternatives_for_every_returned_token():
    with running_server(FakePipeline(reply="abcdef")) as url:
        body = httpx.post(
            f"{url}/v1/chat/completions", json={**CHAT, "max_tokens": 6, "logprobs": True, "top_logprobs": 2}
        ).json()
        plain = httpx.post(f"{url}/v1/chat/completions", json={**CHAT, "max_tokens": 6}).json()
        streamed = httpx.post(
            f"{url}/v1/chat/completions", json={**CHAT, "max_tokens": 6, "logprobs": True, "stream": True}
        )
    content = body["choices"][0]["logprobs"]["content"]
    assert [e["token"] for e in content] == list("abcdef")
    assert all(e["top_logprobs"][0]["token"] == e["token"] and len(e["top_logprobs"]) == 2 for e in content)
    assert all(e["logprob"] < 0 and e["bytes"] == list(e["token"].encode()) for e in content)
    assert plain["choices"][0]["logprobs"] is None
    chunks = [c for c in sse_events(streamed.text) if c["choices"] and c["choices"][0]["logprobs"]]
    assert [e["token"] for c in chunks for e in c["choices"][0]["logprobs"]["content"]] == list("abcdef")


def test_completion_logprobs_stop_with_the_returned_text():
    with running_server(FakePipeline(reply="ab STOP cd")) as url:
        body = httpx.post(
            f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 10, "logprobs": 1, "stop": "STOP"}
        ).json()
    logprobs = body["choices"][0]["logprobs"]
    assert body["choices"][0]["text"] == "ab "
    assert logprobs["tokens"] == ["a", "b", " "] and logprobs["text_offset"] == [0, 1, 2]
    assert [list(top) for top in logprobs["top_logprobs"]] == [["a"], ["b"], [" "]]


@pytest.mark.parametrize(
    "body, param",
    [
        ({**CHAT, "top_logprobs": 3}, "top_logprobs"),
        ({**CHAT, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"prompt": "x", "logprobs": 50}, "logprobs"),
    ],
)
def test_logprobs_limits(body, param):
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    with running_server(FakePipeline()) as url:
        r = httpx.post(f"{url}{path}", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param


def test_an_engine_that_cannot_score_tokens_refuses_logprobs_before_queueing():
    pipeline = FakePipeline()
    pipeline.scores_tokens = False
    pipeline.config = pipeline.config.model_copy(
        update={"speculation": pipeline.config.speculation.model_copy(update={"engine": "library"})}
    )
    with running_server(pipeline) as url:
        r = httpx.post(f"{url}/v1/chat/completions", json={**CHAT, "logprobs": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "logprobs" and not pipeline.calls


def test_a_job_that_cannot_prefill_before_its_deadline_is_not_started_so_the_next_one_is_on_time():
    """Two long prompts (1.5 s of prefill each) and a short one, request_timeout 2.4 s: the second long one
    would start with about 0.9 s left; starting it made the short one late too."""
    pipeline = FakePipeline(reply="ok", n_positions=1024, prefill_s_per_token=1.5 / 300)
    results: dict[str, httpx.Response] = {}
    with running_server(pipeline, request_timeout=2.4, max_queue=4) as url:

        def call(name: str, prompt: str) -> None:
            results[name] = httpx.post(f"{url}/v1/completions", json={"prompt": prompt, "max_tokens": 2}, timeout=10)

        threads = [
            threading.Thread(target=call, args=args)
            for args in (("long1", "y" * 300), ("long2", "z" * 300), ("short", "Hi"))
        ]
        for t in threads:
            t.start()
            time.sleep(0.05)
        for t in threads:
            t.join(10)
    assert results["long1"].status_code == 200
    assert results["long2"].status_code == 504 and "prefill" in results["long2"].json()["error"]["message"]
    assert results["short"].status_code == 200


def test_openapi_describes_every_route_with_its_bodies():
    with running_server(FakePipeline()) as url:
        doc = httpx.get(f"{url}/openapi.json").json()
        page = httpx.get(f"{url}/docs")
    paths = doc["paths"]
    for path in (
        "/v1/chat/completions",
        "/v1/completions",
        "/invocations",
        "/v1/models",
        "/v1/models/{model_id}",
        "/tokenize",
        "/detokenize",
        "/health",
        "/ping",
        "/metrics",
    ):
        assert path in paths, path
    chat = paths["/v1/chat/completions"]["post"]
    assert chat["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/ChatCompletionBody")
    assert {"200", "400", "415", "503", "504"} <= set(chat["responses"])
    schemas = doc["components"]["schemas"]
    assert "messages" in schemas["ChatCompletionBody"]["properties"] and "ErrorResponse" in schemas
    assert "logprobs" in schemas["ChatChoice"]["properties"]
    assert page.status_code == 200 and "/openapi.json" in page.text
