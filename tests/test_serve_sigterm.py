"""A real server process on the stand-in pipeline: SIGTERM (how SageMaker and systemd stop a container) and
client disconnects. The running request finishes, queued ones get 503, /ping answers 503 while it runs, then
the port closes and the process exits 0; a request that outlasts drain_timeout is cancelled and its client
gets a final error; a client that leaves is counted as aborted, not as a server error."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from serve_support import free_port

TESTS = Path(__file__).parent
SCRIPT = """
import logging, sys
logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")  # as the CLI does
sys.path.insert(0, {tests!r})
from serve_support import FakePipeline
from neuron_ssp.config import load_config
from neuron_ssp.serve.server import run_server
config = load_config(None, {{"serve.host": "127.0.0.1", "serve.port": {port}, "serve.drain_timeout": {drain}}})
run_server(config, FakePipeline(reply="a" * {reply}, step_s=0.05, n_positions=1024, max_batch={batch}))
"""


def start(port: int, drain: float = 30, reply: int = 60, batch: int = 8) -> subprocess.Popen:
    script = SCRIPT.format(tests=str(TESTS), port=port, drain=drain, reply=reply, batch=batch)
    return subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ.copy()
    )


def wait_healthy(url: str, proc: subprocess.Popen, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        try:
            if httpx.get(f"{url}/health").status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.1)
    raise AssertionError("server did not start")


def test_sigterm_finishes_the_running_request_refuses_queued_ones_and_exits_0():
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start(port, batch=1)  # one slot: the second request waits in the queue
    try:
        wait_healthy(url, proc)
        results: dict[str, httpx.Response] = {}

        def call(name: str) -> None:
            results[name] = httpx.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 60}, timeout=30)

        running = threading.Thread(target=call, args=("running",))
        running.start()
        time.sleep(0.3)
        queued = threading.Thread(target=call, args=("queued",))
        queued.start()
        time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        running.join(30)
        queued.join(30)
        code = proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 0, proc.stderr.read()
    assert results["running"].status_code == 200
    assert results["running"].json()["choices"][0]["text"] == "a" * 60
    assert results["queued"].status_code == 503 and "shutting down" in results["queued"].json()["error"]["message"]
    try:
        httpx.get(f"{url}/health", timeout=2)
        raise AssertionError("the port is still open after exit")
    except httpx.TransportError:
        pass


def test_while_draining_the_port_stays_open_and_ping_health_and_new_requests_answer_503():
    """SageMaker and load balancers poll /ping: during the drain it says 503 (docs/serving.md), rather than
    the connection being refused, and a new request gets a 503 with Retry-After it can act on."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start(port, reply=300)  # about 5 s of generation
    try:
        wait_healthy(url, proc)
        results: dict[str, httpx.Response] = {}
        running = threading.Thread(
            target=lambda: results.update(
                running=httpx.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 300}, timeout=30)
            )
        )
        running.start()
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        ping, health = httpx.get(f"{url}/ping", timeout=5), httpx.get(f"{url}/health", timeout=5)
        late = httpx.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=5)
        running.join(30)
        code = proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 0, proc.stderr.read()
    assert ping.status_code == health.status_code == 503 and ping.json()["status"] == "draining"
    assert late.status_code == 503 and late.headers["retry-after"] and "shutting down" in late.text
    assert results["running"].status_code == 200 and results["running"].json()["choices"][0]["text"] == "a" * 300


def test_a_client_that_leaves_is_aborted_and_sigterm_past_drain_timeout_sends_a_final_error_and_exits_0():
    """One process (start-up costs seconds), two behaviours:
    1. a non-streaming client that gives up is counted as aborted (status 499), logged at info, not as a 500;
    2. SIGTERM during a 900-token stream (about 15 s) with drain_timeout 1: the stream is cut at the next
       iteration after 1 s, its client gets an error chunk and [DONE], the worker is joined, exit code 0."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start(port, drain=1, reply=900)
    lines: list[str] = []
    try:
        wait_healthy(url, proc)
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 400}, timeout=0.6)
        aborted = 'neuron_ssp_request_success_total{finished_reason="abort"} 1.0'
        deadline = time.monotonic() + 10
        while aborted not in (metrics := httpx.get(f"{url}/metrics").text) and time.monotonic() < deadline:
            time.sleep(0.1)
        with httpx.stream(
            "POST", f"{url}/v1/completions", timeout=30, json={"prompt": "x", "max_tokens": 900, "stream": True}
        ) as r:
            for line in r.iter_lines():
                if not line:
                    continue
                if not lines:
                    signalled = time.monotonic()
                    proc.send_signal(signal.SIGTERM)
                lines.append(line)
        ended = time.monotonic() - signalled
        code = proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    log = proc.stderr.read()
    assert aborted in metrics and 'status="500"' not in metrics and 'status="499"' in metrics, metrics
    assert "client disconnected" in log
    events = [json.loads(line[len("data: ") :]) for line in lines if line.startswith("data: {")]
    assert code == 0, log
    assert lines[-1] == "data: [DONE]" and "error" in events[-1], lines[-3:]
    assert "drain_timeout" in events[-1]["error"]["message"] and events[-1]["error"]["code"] == 503
    assert sum(len(e["choices"][0]["text"]) for e in events[:-1]) < 900  # cut, not finished
    assert ended < 10, ended
    assert " ERROR " not in log and "Traceback" not in log and "terminate called" not in log, log
