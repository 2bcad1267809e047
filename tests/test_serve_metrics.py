"""/metrics as a vLLM dashboard reads it, and every request counted once under what ended it.

tests/vllm_metrics/ keeps what the tests need of vLLM's own files, each with its source: the queries of the
Grafana dashboards vLLM ships (dashboards.json) and vLLM 0.33.0's definitions of the metrics we export under its
names (definitions.json). Tests cannot reach the network, so those files stand in for the originals.
"""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families
from serve_support import FakePipeline, running_server, serving

FIXTURES = Path(__file__).parent / "vllm_metrics"
DASHBOARDS = json.loads((FIXTURES / "dashboards.json").read_text())
DEFINITIONS = json.loads((FIXTURES / "definitions.json").read_text())["metrics"]
SERIES = re.compile(r"vllm:[a-z0-9_:]+")
GROUPED = re.compile(r"by ?\(([a-z_, ]*)\) ?\((?:rate|increase)\((vllm:[a-z0-9_:]+)")  # sum by (labels) (rate(name
OURS = {"model_name": "fake-model", "engine": "0"}


def samples(url: str) -> dict[str, list]:
    """/metrics parsed: every sample by its name (a histogram's _bucket/_sum/_count, a counter's _total)."""
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append(sample)
    return out


def families(url: str) -> dict:
    return {family.name: family for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text)}


def total(found: dict[str, list], name: str, **labels: str) -> float:
    return sum(s.value for s in found.get(name, []) if all(s.labels.get(k) == v for k, v in labels.items()))


def poll(url: str, ready, seconds: float = 10) -> dict[str, list]:
    """/metrics once `ready(samples)` holds (the worker counts a job's end after its client may have its answer)."""
    deadline = time.monotonic() + seconds
    while True:
        found = samples(url)
        if ready(found) or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def some_traffic(url: str) -> list[dict]:
    """Chat, completion, a stop string, a stream with usage, LMI: the non-streamed bodies."""
    bodies = [
        httpx.post(f"{url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "hello"}]}).json(),
        httpx.post(f"{url}/v1/completions", json={"prompt": "abcdefgh", "max_tokens": 5}).json(),
        httpx.post(f"{url}/v1/completions", json={"prompt": "a STOP b", "stop": "STOP", "max_tokens": 20}).json(),
    ]
    streamed = httpx.post(
        f"{url}/v1/completions",
        json={"prompt": "streamed", "max_tokens": 6, "stream": True, "stream_options": {"include_usage": True}},
    )
    assert streamed.status_code == 200
    lmi = httpx.post(f"{url}/invocations", json={"inputs": "xyz", "parameters": {"max_new_tokens": 3}})
    assert lmi.status_code == 200 and all("choices" in b for b in bodies), bodies
    return bodies


def test_vllm_dashboards_find_every_series_they_query_after_some_traffic():
    """Every metric name in the shipped dashboards' queries has a series on /metrics with the labels the queries
    filter and group by; after traffic each one that counts requests or tokens has moved."""
    with running_server(FakePipeline()) as url:
        some_traffic(url)
        found = poll(url, lambda f: total(f, "vllm:request_success_total") == 5)
    for dashboard, content in DASHBOARDS.items():
        for panel in content["panels"]:
            for expr in panel["exprs"]:
                grouped = {name: {g.strip() for g in by.split(",")} for by, name in GROUPED.findall(expr)}
                for name in SERIES.findall(expr):
                    ours = [s for s in found.get(name, []) if all(s.labels.get(k) == v for k, v in OURS.items())]
                    assert ours, f"{dashboard} '{panel['title']}': no {name} with {OURS} on /metrics"
                    missing = grouped.get(name, set()) - {"instance"} - set(ours[0].labels)  # instance: Prometheus'
                    assert not missing, f"{dashboard} '{panel['title']}': {name} lacks {missing}"
                    if name.endswith(("_total", "_count", "_sum")):
                        assert sum(s.value for s in ours) > 0, f"{name} did not move with traffic"
        for query in content["variables"]:  # label_values(metric, label): the label the variable lists
            label = query.rsplit(",", 1)[-1].strip(" )") if "," in query else query[len("label_values(") : -1]
            assert label in {"job", "instance"} or any(label in s.labels for n in found for s in found[n])


def test_the_metrics_under_vllm_names_have_vllms_types_labels_and_buckets():
    with running_server(FakePipeline(n_positions=256)) as url:
        some_traffic(url)
        exported = families(url)
        found = samples(url)
    for definition in DEFINITIONS:
        name = definition["name"]
        family = exported.get(name)
        assert family is not None and family.type == definition["type"], (name, family and family.type)
        extra = set(definition.get("labels", {}))
        assert {s.name for s in family.samples} and all(
            set(s.labels) - {"le"} == {"model_name", "engine", *extra} for s in family.samples
        ), (name, family.samples[:2])
        buckets = definition.get("buckets") or definition.get("buckets_at_max_model_len_256")
        if buckets:
            le = [s.labels["le"] for s in found[f"{name}_bucket"]]
            assert le == [repr(float(b)) for b in buckets] + ["+Inf"], (name, le)
    reasons = {s.labels["finished_reason"] for s in found["vllm:request_success_total"]}
    assert reasons == {"stop", "length", "abort", "error", "repetition"}  # vLLM's FinishReason, each from the start
    positions = {s.labels["position"] for s in found["vllm:spec_decode_num_accepted_tokens_per_pos_total"]}
    assert positions == {str(p) for p in range(FakePipeline().config.speculation.k - 1)}  # k - 1 drafted tokens


def test_the_vllm_counters_count_what_vllms_count():
    """Tokens as processed (prompt at its prefill, every generated token, past a stop string too), a draft per
    target call that scored one, accepted drafts per position, one inter-token gap per step (vLLM's ITL is the
    time between outputs, and a step's output carries several tokens)."""
    with running_server(FakePipeline(reply="abcdefg")) as url:
        bodies = [
            httpx.post(f"{url}/v1/completions", json={"prompt": "hello", "max_tokens": 7}).json() for _ in range(2)
        ]
        found = poll(url, lambda f: total(f, "vllm:request_success_total") == 2)
    spec = [body["speculative"] for body in bodies]
    assert total(found, "vllm:prompt_tokens_total") == 2 * 5
    assert total(found, "vllm:generation_tokens_total") == 2 * 7
    assert total(found, "vllm:spec_decode_num_drafts_total") == sum(s["target_calls"] for s in spec) == 2 * 2
    assert total(found, "vllm:spec_decode_num_draft_tokens_total") == sum(s["draft_tokens"] for s in spec)
    assert total(found, "vllm:spec_decode_num_accepted_tokens_total") == sum(s["accepted_tokens"] for s in spec)
    # each step: 2 accepted drafts then the target's token, so positions 0 and 1 accept in each of the 4 drafts
    assert total(found, "vllm:spec_decode_num_accepted_tokens_per_pos_total", position="0") == 4
    assert total(found, "vllm:spec_decode_num_accepted_tokens_per_pos_total", position="1") == 4
    assert total(found, "vllm:spec_decode_num_accepted_tokens_per_pos_total", position="2") == 0
    assert total(found, "vllm:inter_token_latency_seconds_count") == 2 * 2  # 2 steps after the first token each
    assert total(found, "vllm:time_to_first_token_seconds_count") == 2
    assert total(found, "vllm:request_success_total", finished_reason="length") == 2
    assert total(found, "vllm:request_generation_tokens_sum") == 2 * 7
    assert total(found, "vllm:request_max_num_generation_tokens_sum") == 2 * 7


def test_running_waiting_and_the_slot_usage_that_stands_for_kv_cache_usage():
    pipeline = FakePipeline(reply="a" * 300, step_s=0.05, n_positions=1024, max_batch=4)
    with running_server(pipeline) as url:
        streams = [
            threading.Thread(
                target=httpx.post, args=(f"{url}/v1/completions",), kwargs={"json": {"prompt": "x"}, "timeout": 30}
            )
            for _ in range(2)
        ]
        for stream in streams:
            stream.start()
        found = poll(url, lambda f: total(f, "vllm:num_requests_running") == 2)
        pipeline.reply = "ok"
    assert total(found, "vllm:num_requests_running") == 2 and total(found, "vllm:num_requests_waiting") == 0
    assert total(found, "vllm:kv_cache_usage_perc") == 2 / 4  # 2 of the batch's 4 slots hold a row's cache


def test_a_streamed_client_that_disconnects_is_recorded_as_499_not_200():
    pipeline = FakePipeline(reply="a" * 400, step_s=0.05, n_positions=1024)
    with running_server(pipeline) as url:
        body = {"prompt": "x", "max_tokens": 400, "stream": True}
        with httpx.stream("POST", f"{url}/v1/completions", json=body) as r:
            for _ in zip(range(3), r.iter_lines(), strict=False):
                pass
        assert pipeline.cancelled.wait(5)
        found = poll(url, lambda f: total(f, "neuron_ssp_requests_total") == 1)
    assert total(found, "neuron_ssp_requests_total", endpoint="/v1/completions", status="499") == 1, found.get(
        "neuron_ssp_requests_total"
    )
    assert total(found, "neuron_ssp_request_success_total", finished_reason="abort") == 1


def test_a_request_that_times_out_ends_under_a_finished_reason():
    """504: counted as `timeout` in ours and as vLLM's `abort` (vLLM has no request timeout; the requests its engine
    ends before their end are FINISHED_ABORTED)."""
    pipeline = FakePipeline(reply="a" * 200, step_s=0.05)
    with running_server(pipeline, request_timeout=0.5) as url:
        slow = httpx.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 200})
        found = poll(url, lambda f: total(f, "neuron_ssp_request_success_total") == 1)
    assert slow.status_code == 504
    assert total(found, "neuron_ssp_request_success_total", finished_reason="timeout") == 1, found.get(
        "neuron_ssp_request_success_total"
    )
    assert total(found, "vllm:request_success_total", finished_reason="abort") == 1
    assert total(found, "vllm:e2e_request_latency_seconds_count") == 1


def test_a_stream_cut_at_drain_still_sends_its_usage_chunk_before_its_error():
    """include_usage promises a usage chunk before [DONE]: a stream cut past drain_timeout sends it too, before
    the error chunk (an OpenAI client raises at the error chunk, so a usage chunk after it would never be read)."""
    pipeline = FakePipeline(reply="a" * 400, step_s=0.05, n_positions=1024)
    body = {"prompt": "x", "max_tokens": 400, "stream": True, "stream_options": {"include_usage": True}}
    lines: list[str] = []
    with serving(pipeline) as (url, app), httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=30) as r:
        for line in r.iter_lines():
            if line and len(lines) == 3:
                app.state.worker.drain(0.0)  # SIGTERM's drain with drain_timeout already past
            if line:
                lines.append(line)
    events = [json.loads(line[len("data: ") :]) for line in lines if line.startswith("data: {")]
    assert lines[-1] == "data: [DONE]" and "drain_timeout" in events[-1]["error"]["message"], lines[-3:]
    usage = events[-2]
    assert usage["choices"] == [] and usage["usage"]["prompt_tokens"] == 1, usage
    sent = sum(len(e["choices"][0]["text"]) for e in events[:-2])
    assert 0 < sent < 400 and usage["usage"]["completion_tokens"] == sent  # one character per token here
