"""The embedded model through `neuron-ssp serve` at serve.max_batch 8: eight clients at once get, token for
token, what each gets alone, greedy and seeded sampled."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import httpx
import pytest

from neuron_ssp.tools.serve_load import chat_body, start_server

pytestmark = pytest.mark.slow

PROMPTS = [
    json.loads(line)["prompt"]
    for line in (Path(__file__).parents[1] / "benchmarks" / "serve_prompts_short.jsonl").read_text().splitlines()
][:8]
SAMPLING = [None, {"temperature": 0.8, "seed": 123}] * 4


def ask(url: str, i: int) -> str:
    body = chat_body(PROMPTS[i], 24, stream=False, sampling=SAMPLING[i])
    response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=600)
    response.raise_for_status()
    return response.json()["choices"][0]["message"]["content"]


def test_eight_clients_at_once_get_what_each_gets_alone(use_embedded_cache: str, tmp_path: Path) -> None:
    config = tmp_path / "batch8.yaml"
    config.write_text("serve:\n  max_batch: 8\n")
    server = start_server(config, max_queue=16, threads=1, log_dir=tmp_path)
    try:
        alone = [ask(server.url, i) for i in range(len(PROMPTS))]
        together: dict[int, str] = {}
        clients = [
            threading.Thread(target=lambda i=i: together.__setitem__(i, ask(server.url, i)))
            for i in range(len(PROMPTS))
        ]
        for client in clients:
            client.start()
        for client in clients:
            client.join(600)
        metrics = httpx.get(f"{server.url}/metrics", timeout=10).text
    finally:
        assert server.stop() == 0
    assert [together[i] for i in range(len(PROMPTS))] == alone
    many = max(float(line.split()[-1]) for line in metrics.splitlines() if line.startswith("neuron_ssp_batch_size_sum"))
    steps = max(
        float(line.split()[-1]) for line in metrics.splitlines() if line.startswith("neuron_ssp_batch_size_count")
    )
    assert many / steps > 1.5  # the requests really ran together
