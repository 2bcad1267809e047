"""Prefix caching through `neuron-ssp serve` on the embedded model: a conversation's later turns reuse what the
earlier ones computed (usage.prompt_tokens_details.cached_tokens, vLLM's prefix-cache counters on /metrics), and
every answer, greedy and seeded, streamed or not, is the one a server without prefix caching gives."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from neuron_ssp.tools.serve_load import start_server

pytestmark = pytest.mark.slow

SYSTEM = (
    "You are a careful assistant for a railway company. Answer in one or two sentences, name the line and the "
    "station when you can, and never invent a timetable. Lines: the Coast line runs from Harbour to Northfield; "
    "the Valley line from Harbour to Millbrook; trains leave every twenty minutes between six and midnight."
)
QUESTIONS = ["Which line goes to Millbrook?", "How often do trains leave?", "Where does the Coast line end?"]


def conversation(turns: int) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": SYSTEM}]
    for question in QUESTIONS[:turns]:
        messages += [{"role": "user", "content": question}, {"role": "assistant", "content": "I will check."}]
    return messages[:-1]


def ask(url: str, turns: int, sampling: dict[str, Any]) -> dict[str, Any]:
    body = {"messages": conversation(turns), "max_tokens": 20, "temperature": 0, **sampling}
    response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=600)
    response.raise_for_status()
    return response.json()


def answers(config: Path, tmp_path: Path) -> tuple[list[dict[str, Any]], str]:
    server = start_server(config, max_queue=4, threads=1, log_dir=tmp_path)
    try:
        replies = [
            ask(server.url, turns, sampling)
            for turns in (1, 2, 3)
            for sampling in ({}, {"temperature": 0.8, "seed": 5})
        ]
        metrics = httpx.get(f"{server.url}/metrics", timeout=10).text
    finally:
        assert server.stop() == 0
    return replies, metrics


def counter(metrics: str, name: str) -> float:
    return sum(float(line.split()[-1]) for line in metrics.splitlines() if line.startswith(name + "{"))


def test_later_turns_reuse_the_earlier_ones_and_answer_as_without_the_cache(use_embedded_cache: str, tmp_path: Path):
    cached_config, cold_config = tmp_path / "cached.yaml", tmp_path / "cold.yaml"
    cached_config.write_text("serve:\n  max_batch: 2\n")
    cold_config.write_text("serve:\n  max_batch: 2\nplatform:\n  prefix_cache: false\n")
    cached, metrics = answers(cached_config, tmp_path)
    cold, cold_metrics = answers(cold_config, tmp_path)
    assert [r["choices"][0]["message"]["content"] for r in cached] == [
        r["choices"][0]["message"]["content"] for r in cold
    ]
    hits = [r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in cached]
    prompts = [r["usage"]["prompt_tokens"] for r in cached]
    assert hits[0] == 0 and all(hit > 0.5 * prompt for hit, prompt in zip(hits[1:], prompts[1:], strict=True))
    assert [r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in cold] == [0] * len(cold)
    assert counter(metrics, "vllm:prefix_cache_queries_total") == sum(prompts)
    assert counter(metrics, "vllm:prefix_cache_hits_total") == sum(hits)
    assert counter(cold_metrics, "vllm:prefix_cache_hits_total") == 0
