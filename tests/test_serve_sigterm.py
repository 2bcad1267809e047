"""SIGTERM (how SageMaker and systemd stop a container): the running request finishes, queued ones get
503, the port closes and the process exits 0. Run in a subprocess on the stand-in pipeline."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
from serve_support import free_port

TESTS = Path(__file__).parent
SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
from serve_support import FakePipeline
from neuron_ssp.config import load_config
from neuron_ssp.serve.server import run_server
config = load_config(None, {{"serve.host": "127.0.0.1", "serve.port": {port}}})
run_server(config, FakePipeline(reply="a" * 60, step_s=0.05))
"""


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
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT.format(tests=str(TESTS), port=port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ.copy())
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
