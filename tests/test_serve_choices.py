"""n > 1: n rows of the batch, a seed per choice derived from the request's, usage summed, streamed under each
choice's index (the openai client reads them)."""

from __future__ import annotations

import hashlib
import json
import time

import httpx
import pytest
from serve_support import FakePipeline, running_server

from neuron_ssp.config import SamplingConfig
from neuron_ssp.serve.app import choice_sampling

openai = pytest.importorskip("openai")

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hello"}]}


def derived(seed: int, choice: int) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{choice}".encode()).digest()[:8], "big") >> 1


def test_n_choices_are_n_rows_with_derived_seeds_and_summed_usage():
    pipeline = FakePipeline()
    with running_server(pipeline) as url:
        reply = openai.OpenAI(base_url=f"{url}/v1", api_key="x").chat.completions.create(
            model="fake-model", messages=CHAT["messages"], n=3, temperature=0.7, seed=11
        )
    assert [c.index for c in reply.choices] == [0, 1, 2] and {c.message.content for c in reply.choices} == {"olleh"}
    assert reply.usage.prompt_tokens == 5 and reply.usage.completion_tokens == 3 * 6
    assert [c["sampling"].seed for c in pipeline.calls] == [11, derived(11, 1), derived(11, 2)]
    assert reply.model_extra["speculative"]["seed"] == 11
    assert reply.model_extra["speculative"]["target_calls"] == 3 * 2  # summed over the choices


def test_greedy_choices_keep_the_seed_and_a_seedless_request_gets_one_fresh_seed_for_all():
    assert choice_sampling(SamplingConfig(temperature=0.0, seed=5), 2).seed == 5  # greedy draws nothing
    pipeline = FakePipeline()
    with running_server(pipeline) as url:
        httpx.post(f"{url}/v1/chat/completions", json={**CHAT, "n": 2, "temperature": 1.0})
    first, second = (c["sampling"].seed for c in pipeline.calls)
    assert first is not None and second == derived(first, 1)


def test_streamed_choices_arrive_under_their_index_each_with_its_end():
    with running_server(FakePipeline(reply="abcdefg")) as url:
        body = {**CHAT, "n": 2, "stream": True, "stream_options": {"include_usage": True}}
        r = httpx.post(f"{url}/v1/chat/completions", json=body)
    events = [json.loads(line[6:]) for line in r.text.split("\n\n") if line.startswith("data: {")]
    assert r.text.rstrip().endswith("data: [DONE]")
    text = {0: "", 1: ""}
    ends = {}
    for event in events:
        for choice in event["choices"]:
            text[choice["index"]] += choice["delta"].get("content") or ""
            if choice["finish_reason"]:
                ends[choice["index"]] = choice["finish_reason"]
    assert text == {0: "abcdefg", 1: "abcdefg"} and ends == {0: "stop", 1: "stop"}
    roles = [c["index"] for e in events for c in e["choices"] if c["delta"].get("role")]
    assert roles == [0, 1]
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 2 * 8


def test_each_choice_is_read_for_tool_calls_on_its_own():
    call = '{"name": "f", "parameters": {}}'
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    with running_server(FakePipeline(reply=call, n_positions=4096)) as url:
        reply = openai.OpenAI(base_url=f"{url}/v1", api_key="x").chat.completions.create(
            model="fake-model", messages=CHAT["messages"], n=2, tools=[tool]
        )
    assert [c.finish_reason for c in reply.choices] == ["tool_calls", "tool_calls"]
    assert reply.choices[0].message.tool_calls[0].id != reply.choices[1].message.tool_calls[0].id


def test_n_above_what_the_server_holds_is_a_400_and_n_rows_take_n_places():
    with running_server(FakePipeline(max_batch=2), max_queue=1) as url:
        over = httpx.post(f"{url}/v1/completions", json={"prompt": "x", "n": 4})
        fits = httpx.post(f"{url}/v1/completions", json={"prompt": "x", "n": 3})
    assert over.status_code == 400 and over.json()["error"]["param"] == "n" and "must be <= 3" in over.text
    assert fits.status_code == 200 and len(fits.json()["choices"]) == 3


def test_a_client_that_leaves_gives_its_choices_places_back_at_once():
    """A stream of n choices left by its client holds no place any more: the next request of n is admitted, where the
    places used to stay held until the worker reached each cancelled job (a 503 in schemathesis's run)."""
    pipeline = FakePipeline(reply="x" * 200, step_s=1.0, max_batch=2)  # the worker reaches a cut job a second later
    with running_server(pipeline, max_queue=2) as url:
        body = {"prompt": "x", "n": 4, "stream": True, "max_tokens": 150}
        with httpx.Client() as left, left.stream("POST", f"{url}/v1/completions", json=body) as stream:
            next(stream.iter_lines())  # the stream has begun: its four jobs hold the server's four places
        time.sleep(0.3)  # the server sees the client go (Starlette cancels the stream at once)
        again = httpx.post(f"{url}/v1/completions", json={"prompt": "x", "n": 4, "max_tokens": 2})
    assert again.status_code == 200, again.text
