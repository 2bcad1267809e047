"""Property-based fuzzing of the running server from its own /openapi.json (schemathesis + hypothesis).

A tiny real pipeline (2-layer random Llama, character tokenizer, 64 cache positions, 4 tokens by
default) behind the real app on 127.0.0.1: every generated request, valid bodies and invalid ones,
must get a 2xx or 4xx answer that matches the documented schema, never a 5xx, and the server must be
healthy afterwards. Bounded: a fixed number of examples per route and mode, no shrinking database.
"""

from __future__ import annotations

import time

import httpx
import pytest
import schemathesis
from conftest import tiny_llama
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance
from serve_support import running_server
from tools_support import pipeline_on, tiny_config

from neuron_ssp.backends.torch.scoring import TorchBackend

EXAMPLES = {"POST": 25, "GET": 3}  # per route and generation mode; the whole file runs in well under a minute


@pytest.fixture(scope="module")
def server():
    pipeline = pipeline_on(TorchBackend(tiny_llama(0), 64), tiny_config(generation={"max_new_tokens": 4}))
    with running_server(pipeline, request_timeout=20) as url:
        yield url


def test_generated_requests_get_2xx_or_4xx_matching_the_schema_and_the_server_stays_healthy(server):
    schema = schemathesis.openapi.from_url(f"{server}/openapi.json")
    started = time.monotonic()
    tried: dict[str, int] = {}
    for result in schema.get_all_operations():
        operation = result.ok()
        post = operation.method.upper() == "POST"  # a GET without parameters has nothing to make invalid
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE) if post else (GenerationMode.POSITIVE,):
            @settings(max_examples=EXAMPLES[operation.method.upper()], deadline=None, database=None,
                      phases=[Phase.generate], suppress_health_check=list(HealthCheck))
            @given(case=operation.as_strategy(generation_mode=mode))
            def call(case) -> None:
                response = case.call(base_url=server, timeout=30)
                case.validate_response(response, checks=[not_a_server_error, response_schema_conformance])
                tried[case.operation.label] = tried.get(case.operation.label, 0) + 1

            call()
    assert {"POST /v1/chat/completions", "POST /v1/completions", "POST /invocations"} <= set(tried), tried
    assert httpx.get(f"{server}/health").json()["status"] == "ok"
    ok = httpx.post(f"{server}/v1/completions", json={"prompt": "still here", "max_tokens": 2})
    assert ok.status_code == 200
    assert time.monotonic() - started < 120
