"""The server on a tiny real pipeline (2-layer random Llama, character tokenizer): request values that
reach the real sampler, where the stand-in pipeline of tests/serve_support.py would not notice them."""

from __future__ import annotations

import httpx
import pytest
from conftest import tiny_llama
from serve_support import running_server
from tools_support import pipeline_on, tiny_config

from neuron_ssp.backends.torch.scoring import TorchBackend


@pytest.fixture(scope="module")
def server():
    pipeline = pipeline_on(TorchBackend(tiny_llama(0), 64), tiny_config(generation={"max_new_tokens": 4}))
    with running_server(pipeline, request_timeout=20) as url:
        yield url


@pytest.mark.parametrize(
    "path, body",
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]}),
        ("/v1/completions", {"prompt": "The capital of France is"}),
    ],
)
def test_a_top_p_that_is_zero_in_fp32_samples_the_most_likely_token(server, path, body):
    """top_p 1e-46 passes the (0, 1] rule but is 0.0 in fp32: every token was dropped, the probabilities were
    NaN, `torch.multinomial` raised (a 500) and the seeded race returned token 0 (spaces here). The nucleus
    keeps the most likely token, so the answer is the greedy one."""
    sampled = httpx.post(f"{server}{path}", json={**body, "temperature": 1, "top_p": 1e-46, "seed": 1, "max_tokens": 4})
    greedy = httpx.post(f"{server}{path}", json={**body, "temperature": 0, "max_tokens": 4})
    assert sampled.status_code == 200, sampled.text
    assert sampled.json()["choices"] == greedy.json()["choices"]
