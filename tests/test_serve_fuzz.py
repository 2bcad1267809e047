"""The running server fuzzed from its own /openapi.json: schemathesis's CLI, every check, every phase.

A tiny real pipeline (2-layer random Llama, character tokenizer, 512 cache positions, 4 tokens by default)
behind the real app on 127.0.0.1. `schemathesis run --checks all` runs the coverage phase (each limit the
document states, at and past its bound; methods the document does not declare) and the fuzzing phase
(bodies the schema allows, and bodies it forbids), with every check: no 5xx; statuses, content types,
headers and bodies (SSE events included) as documented; forbidden bodies refused; undeclared methods 405
with `Allow`. Its positive_data_acceptance is replaced by the stricter one of tests/fuzz_hooks.py: a body
the schema allows gets a 2xx, except a prompt over the context (a rule no schema can state). Bounded:
EXAMPLES per operation and mode, a fixed seed, no shrinking, a time limit; the server must stay healthy.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from conftest import tiny_llama
from serve_support import running_server
from tools_support import pipeline_on, tiny_config

from neuron_ssp.backends.torch.scoring import TorchBackend

EXAMPLES = 25  # per operation in the fuzzing phase; the coverage phase adds its own (~1,250 here)
SEED = 1  # the same cases every run; change it to explore
TIME_LIMIT_S = 400  # the run takes 20-80 s on a shared 2-core machine
GENERATION = {"/v1/chat/completions", "/v1/completions", "/invocations"}
OPERATIONS = 11  # generation 3, /v1/models and /v1/models/{id}, /tokenize, /detokenize, /health, /ping, /metrics, /
TESTS = Path(__file__).parent


@pytest.fixture(scope="module")
def server():
    pipeline = pipeline_on(TorchBackend(tiny_llama(0), 512), tiny_config(generation={"max_new_tokens": 4}))
    with running_server(pipeline, request_timeout=60) as url:
        yield url


def schemathesis(url: str, tmp_path: Path) -> tuple[subprocess.CompletedProcess, dict, list[list]]:
    """Run the CLI against `url`: its output, its JSON report, and one [phase, mode, method, path, status]
    per answer (tests/fuzz_hooks.py)."""
    report, tally = tmp_path / "report.json", tmp_path / "tally.jsonl"
    env = {
        **os.environ,
        "SCHEMATHESIS_HOOKS": "fuzz_hooks",
        "NEURON_SSP_FUZZ_TALLY": str(tally),
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
    }
    args = [
        sys.executable,
        "-m",
        "schemathesis.cli",
        "run",
        f"{url}/openapi.json",
        "--checks",
        "all",
        "--exclude-checks",
        "positive_data_acceptance",
        "--max-examples",
        str(EXAMPLES),
        "--seed",
        str(SEED),
        "--no-shrink",
        "--workers",
        "1",
        "--generation-database",
        "none",
        "--continue-on-failure",
        "--request-timeout",
        "60",
        "--no-color",
        "--report",
        "json",
        "--report-json-path",
        str(report),
    ]
    out = subprocess.run(args, capture_output=True, text=True, env=env, timeout=TIME_LIMIT_S, cwd=tmp_path)
    answers = [json.loads(line) for line in tally.read_text().splitlines()] if tally.exists() else []
    return out, json.loads(report.read_text()) if report.exists() else {}, answers


def test_schemathesis_with_every_check_finds_nothing_and_schema_valid_bodies_get_2xx(server, tmp_path):
    started = time.monotonic()
    out, report, answers = schemathesis(server, tmp_path)
    seconds = time.monotonic() - started
    statuses = collections.Counter(
        (mode, "generation" if path in GENERATION else "other", status) for _, mode, _, path, status in answers
    )
    print(
        f"schemathesis: {report.get('test_cases')} in {seconds:.0f} s;",
        ", ".join(f"{' '.join(map(str, k))}: {v}" for k, v in sorted(statuses.items(), key=str)),
    )
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]
    assert report["test_cases"]["with_failures"] == 0 and not report["errors"], report
    assert report["operations"]["tested"] == report["operations"]["total"] == OPERATIONS, report["operations"]
    assert len(answers) == report["test_cases"]["generated"] > 1000
    assert not [a for a in answers if a[4] >= 500], "a 5xx"
    valid = [status for _, mode, _, path, status in answers if mode == "positive" and path in GENERATION]
    assert len(valid) > 200 and sum(200 <= s < 300 for s in valid) >= 0.95 * len(valid), statuses
    undeclared = [a for a in answers if a[2] in ("PUT", "DELETE", "TRACE")]
    assert len(undeclared) == 3 * OPERATIONS and all(a[4] == 405 for a in undeclared), undeclared  # with Allow
    assert httpx.get(f"{server}/health").json()["status"] == "ok"
    assert httpx.post(f"{server}/v1/completions", json={"prompt": "still here", "max_tokens": 2}).status_code == 200
    assert seconds < TIME_LIMIT_S
