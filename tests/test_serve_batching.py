"""The server schedules rows: concurrent requests share the loop's calls, and each gets its own output."""

from __future__ import annotations

import threading

import httpx
from conftest import tiny_llama
from serve_support import running_server
from tools_support import pipeline_on, tiny_config

from neuron_ssp.backends.torch.scoring import TorchBackend
from neuron_ssp.config import SamplingConfig

PROMPTS = ["abcabcabd abcabc", "xyz xyz xyz", "tell me something", "a b c a b c a", "zzzz", "hello hello"]
SAMPLING = [
    {"temperature": 0},
    {"temperature": 0.9, "seed": 5},
    {"temperature": 0},
    {"temperature": 1.2, "top_p": 0.8, "seed": 77},
    {"temperature": 0.7, "top_k": 5, "seed": 3},
    {"temperature": 0},
]


def ask_at_once(url: str, bodies: list[dict]) -> list[str]:
    """Each completion request from its own client thread, all at once; the texts in request order."""
    answers: dict[int, str] = {}

    def ask(i: int) -> None:
        response = httpx.post(f"{url}/v1/completions", json=bodies[i], timeout=60)
        response.raise_for_status()
        answers[i] = response.json()["choices"][0]["text"]

    clients = [threading.Thread(target=ask, args=(i,)) for i in range(len(bodies))]
    for client in clients:
        client.start()
    for client in clients:
        client.join(120)
    return [answers[i] for i in range(len(bodies))]


def test_concurrent_requests_get_the_output_each_gets_alone():
    config = tiny_config(serve={"max_batch": 3}, speculation={"k": 4, "policy": "cost"})
    pipeline = pipeline_on(TorchBackend(tiny_llama(0), 512, slots=3), config)
    alone = []
    for prompt, sampling in zip(PROMPTS, SAMPLING, strict=True):
        result = pipeline.generate_ids(pipeline.encode(prompt, chat_template=False), 20, SamplingConfig(**sampling))
        alone.append(pipeline.tokenizer.decode(result.tokens, skip_special_tokens=True))
    with running_server(pipeline, max_batch=3) as url:
        answers = ask_at_once(
            url,
            [
                {"prompt": prompt, "max_tokens": 20, **sampling}
                for prompt, sampling in zip(PROMPTS, SAMPLING, strict=True)
            ],
        )
        metrics = httpx.get(f"{url}/metrics", timeout=10).text
    assert answers == alone
    steps_of_many = [line for line in metrics.splitlines() if line.startswith('neuron_ssp_batch_size_bucket{le="1.0"}')]
    total = [line for line in metrics.splitlines() if line.startswith("neuron_ssp_batch_size_count")]
    assert float(steps_of_many[0].split()[-1]) < float(total[0].split()[-1])  # some steps ran several rows


def test_the_scheduler_runs_no_more_rows_than_the_serving_batch():
    """A target holding more slots than serve.max_batch (a Neuron model compiled for a larger batch): the
    scheduler admits serve.max_batch rows, the rest wait in the queue."""
    config = tiny_config(serve={"max_batch": 2}, speculation={"k": 4})
    pipeline = pipeline_on(TorchBackend(tiny_llama(0), 512, slots=4), config)
    with running_server(pipeline, max_batch=2) as url:
        ask_at_once(url, [{"prompt": p, "max_tokens": 12, "temperature": 0} for p in PROMPTS])
        metrics = httpx.get(f"{url}/metrics", timeout=10).text
    at_most = {
        line.split('le="')[1].split('"')[0]: float(line.split()[-1])
        for line in metrics.splitlines()
        if line.startswith("neuron_ssp_batch_size_bucket")
    }
    steps = float(
        next(line for line in metrics.splitlines() if line.startswith("neuron_ssp_batch_size_count")).split()[-1]
    )
    assert at_most["2.0"] == steps and at_most["1.0"] < steps  # rows shared steps, never more than two
