"""bench-serve: load on a real `neuron-ssp serve` process over loopback, judged against three targets.

1. overhead: one client, greedy; the server's end-to-end latency next to `SpeculativeGenerator.generate`
   called in this process for the same prompt and tokens, the two interleaved pair by pair;
2. concurrency: N clients x M requests (streaming), bracketed by two sequential single-client passes
   over the same requests; greedy outputs must equal the sequential ones;
3. overflow: a second server with a small queue, every client at once; each request must get 200 or
   503 within its timeout, and the server must stay healthy.

`--repeated` measures instead what the suffix drafter learns across requests, through the server: the
prompt set twice in a row from one client, on a fresh server per kind of client: greedy clients, and
clients that send a temperature and a seed (as OpenAI clients do). The second pass drafts from the
first pass's history; its tokens/s over the first pass's is the gain, side by side for both kinds.

Every request has a timeout and the counts are bounded, so the benchmark always ends.
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import torch
import yaml

from neuron_ssp.config import Config

CLI = [sys.executable, "-c", "from neuron_ssp.cli import main; main()"]
Step = Callable[[str], None]


@dataclass
class Outcome:
    status: int
    text: str = ""
    tokens: int = 0
    ttft_s: float = 0.0
    e2e_s: float = 0.0
    error: str = ""
    cached_tokens: int = 0


@dataclass
class ServerProcess:
    proc: subprocess.Popen[str]
    url: str
    log: Path

    def cpu_s(self) -> float | None:
        """CPU seconds the server process has used so far, all its threads (Linux's /proc; None elsewhere)."""
        return process_cpu_s(self.proc.pid)

    def stop(self, timeout_s: float = 120) -> int:
        """SIGTERM, as SageMaker stops a container; returns the exit code (0 is a clean drain)."""
        self.proc.terminate()
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def start_server(
    config_path: Path | None, max_queue: int, threads: int | None, log_dir: Path, ready_timeout_s: float = 900
) -> ServerProcess:
    port = _free_port()
    args = [*CLI, "serve", "--host", "127.0.0.1", "--port", str(port), "--max-queue", str(max_queue)]
    if config_path is not None:
        args += ["--config", str(config_path)]
    if threads:
        args += ["--threads", str(threads)]
    env = {**os.environ, **({"OMP_NUM_THREADS": str(threads)} if threads else {})}
    log = log_dir / f"serve-{port}.log"
    with log.open("w") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, text=True, env=env)
    server = ServerProcess(proc, f"http://127.0.0.1:{port}", log)
    deadline = time.monotonic() + ready_timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(f"{server.url}/ping", timeout=5).status_code == 200:
                return server
        except httpx.TransportError:
            time.sleep(0.5)
    server.stop()
    raise RuntimeError(f"the server did not become ready; see {log}:\n{log.read_text()[-2000:]}")


def chat_body(prompt: str, max_tokens: int, stream: bool, sampling: dict[str, Any] | None = None) -> dict[str, Any]:
    """A chat request, greedy unless `sampling` says otherwise: the instruct model answers its template (a raw
    prompt often ends at once)."""
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": stream,
        **(sampling or {}),
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def stream_chat(client: httpx.Client, url: str, prompt: str, max_tokens: int, timeout_s: float) -> Outcome:
    """One streamed /v1/chat/completions request, timed from the client's side."""
    return stream_body(client, url, chat_body(prompt, max_tokens, stream=True), timeout_s)


def stream_body(client: httpx.Client, url: str, body: dict[str, Any], timeout_s: float) -> Outcome:
    """One streamed /v1/chat/completions request of `body` (with stream_options.include_usage), timed from the
    client's side; `cached_tokens`: the prompt tokens its usage says came from the prefix cache."""
    start = time.perf_counter()
    parts: list[str] = []
    outcome = Outcome(0)
    try:
        with client.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=timeout_s) as response:
            outcome.status = response.status_code
            if response.status_code != 200:
                response.read()
                outcome.error = response.text[:200]
            else:
                for line in response.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[len("data: ") :])
                    if "error" in chunk:
                        outcome.error = chunk["error"]["message"][:200]
                    for choice in chunk.get("choices", []):
                        text = choice["delta"].get("content") or ""
                        if text and not parts:
                            outcome.ttft_s = time.perf_counter() - start
                        if text:
                            parts.append(text)
                    if chunk.get("usage"):
                        outcome.tokens = chunk["usage"]["completion_tokens"]
                        outcome.cached_tokens = (chunk["usage"].get("prompt_tokens_details") or {}).get(
                            "cached_tokens", 0
                        )
    except httpx.HTTPError as exc:
        outcome.error = f"{type(exc).__name__}: {exc}"[:200]
    outcome.e2e_s = time.perf_counter() - start
    outcome.text = "".join(parts)
    return outcome


def run_clients(
    url: str, prompts: list[str], clients: int, requests: int, max_tokens: int, timeout_s: float, step: Step
) -> tuple[list[list[Outcome]], float]:
    """`clients` threads, each sending its `requests` prompts back to back; returns outcomes and wall time."""
    outcomes: list[list[Outcome]] = [[] for _ in range(clients)]

    def client_loop(index: int) -> None:
        with httpx.Client() as client:
            for r in range(requests):
                outcomes[index].append(
                    stream_chat(client, url, prompts[(index * requests + r) % len(prompts)], max_tokens, timeout_s)
                )
                step("request")

    threads = [threading.Thread(target=client_loop, args=(i,)) for i in range(clients)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout_s * requests + 60)
    return outcomes, time.perf_counter() - start


def serve_requests(
    url: str, prompts: list[str], clients: int, max_tokens: int, timeout_s: float, step: Step
) -> tuple[list[Outcome], float]:
    """Every prompt once, through `clients` threads that each take the next unsent prompt when their last one
    is answered (closed-loop clients sharing one queue); returns the outcomes in prompt order and the wall time."""
    outcomes: list[Outcome | None] = [None] * len(prompts)
    queue = iter(range(len(prompts)))
    lock = threading.Lock()

    def client_loop() -> None:
        with httpx.Client() as client:
            while True:
                with lock:
                    index = next(queue, None)
                if index is None:
                    return
                outcomes[index] = stream_chat(client, url, prompts[index], max_tokens, timeout_s)
                step("request")

    threads = [threading.Thread(target=client_loop) for _ in range(clients)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout_s * len(prompts) + 60)
    wall = time.perf_counter() - start
    return [outcome or Outcome(0, error="not sent: the clients timed out") for outcome in outcomes], wall


def process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of process `pid` (/proc/<pid>/stat fields 14 and 15); None without /proc."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # after the command name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def summary(outcomes: list[Outcome], wall_s: float) -> dict[str, Any]:
    ok = [o for o in outcomes if o.status == 200 and not o.error]
    tokens = sum(o.tokens for o in ok)
    return {
        "requests": len(outcomes),
        "ok": len(ok),
        "errors": sum(1 for o in outcomes if o.status not in (200, 503) or (o.status == 200 and o.error)),
        "http_503": sum(1 for o in outcomes if o.status == 503),
        "wall_s": wall_s,
        "requests_per_s": len(ok) / wall_s if wall_s else 0.0,
        "output_tokens_per_s": tokens / wall_s if wall_s else 0.0,
        **{f"ttft_p{q}_s": percentile([o.ttft_s for o in ok], q) for q in (50, 95, 99)},
        **{f"e2e_p{q}_s": percentile([o.e2e_s for o in ok], q) for q in (50, 95, 99)},
    }


@dataclass
class ServeBenchResult:
    settings: dict[str, Any]
    overhead: dict[str, Any] = field(default_factory=dict)
    concurrency: dict[str, Any] = field(default_factory=dict)
    overflow: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def measure_overhead(
    pipeline: Any, url: str, prompts: list[str], max_tokens: int, pairs: int, timeout_s: float, step: Step
) -> dict[str, Any]:
    """Direct `SpeculativeGenerator.generate` vs the same request over HTTP, alternating which goes first."""
    direct_s, http_s, same = [], [], 0
    with httpx.Client() as client:
        for i in range(pairs):
            prompt = prompts[i % len(prompts)]
            ids = pipeline.encode(prompt)  # one user turn: what /v1/chat/completions encodes
            tokens: dict[str, str] = {}
            for kind in ("direct", "http") if i % 2 == 0 else ("http", "direct"):
                start = time.perf_counter()
                if kind == "direct":
                    result = pipeline.generator.generate(ids, max_tokens, pipeline.eos_token_ids)
                    direct_s.append(time.perf_counter() - start)
                    tokens[kind] = pipeline.tokenizer.decode(result.tokens, skip_special_tokens=True)
                else:
                    r = client.post(
                        f"{url}/v1/chat/completions",
                        timeout=timeout_s,
                        json=chat_body(prompt, max_tokens, stream=False),
                    )
                    http_s.append(time.perf_counter() - start)
                    r.raise_for_status()
                    tokens[kind] = r.json()["choices"][0]["message"]["content"]
            same += tokens["direct"] == tokens["http"]
            step("pair")
    return {
        "pairs": pairs,
        "direct_total_s": sum(direct_s),
        "http_total_s": sum(http_s),
        "ratio": sum(http_s) / sum(direct_s),
        "direct_p50_s": percentile(direct_s, 50),
        "http_p50_s": percentile(http_s, 50),
        "same_text": same,
    }


def measure_concurrency(
    url: str, prompts: list[str], clients: int, requests: int, max_tokens: int, timeout_s: float, step: Step
) -> dict[str, Any]:
    """Sequential pass, concurrent pass, sequential pass: the two sequential ones bracket any drift."""
    counts = [prefix_cache_counts(url)]
    before, before_wall = run_clients(url, prompts, 1, clients * requests, max_tokens, timeout_s, step)
    counts.append(prefix_cache_counts(url))
    during, during_wall = run_clients(url, prompts, clients, requests, max_tokens, timeout_s, step)
    counts.append(prefix_cache_counts(url))
    after, after_wall = run_clients(url, prompts, 1, clients * requests, max_tokens, timeout_s, step)
    counts.append(prefix_cache_counts(url))
    sequential = summary(before[0] + after[0], before_wall + after_wall)
    concurrent = summary([o for c in during for o in c], during_wall)
    reference = [o.text for o in before[0]]
    mismatches = sum(
        1 for c, outs in enumerate(during) for r, o in enumerate(outs) if o.text != reference[c * requests + r]
    )
    lost = clients * requests - sum(len(outs) for outs in during)
    return {
        "sequential": sequential,
        "concurrent": concurrent,
        "lost": lost,
        "outputs_differing": mismatches,
        "sequential_passes_equal": [o.text for o in before[0]] == [o.text for o in after[0]],
        # the same prompts pass three times: later passes find them in the prefix cache (platform.prefix_cache)
        "prefix_cache_hit_rate": [hit_rate(a, b) for a, b in itertools.pairwise(counts)],
        "throughput_ratio": concurrent["output_tokens_per_s"] / sequential["output_tokens_per_s"]
        if sequential["output_tokens_per_s"]
        else 0.0,
    }


def measure_overflow(
    url: str, prompts: list[str], clients: int, requests: int, max_tokens: int, timeout_s: float, step: Step
) -> dict[str, Any]:
    outcomes, wall = run_clients(url, prompts, clients, requests, max_tokens, timeout_s, step)
    flat = [o for c in outcomes for o in c]
    with httpx.Client() as client:
        healthy = client.get(f"{url}/health", timeout=10).status_code == 200
        after = stream_chat(client, url, prompts[0], max_tokens, timeout_s)
    return {
        **summary(flat, wall),
        "statuses": sorted({o.status for o in flat}),
        "all_200_or_503_in_time": all(o.status in (200, 503) and o.e2e_s <= timeout_s for o in flat),
        "healthy_after": healthy and after.status == 200 and not after.error,
    }


def run_serve_bench(
    config: Config,
    config_path: Path | None,
    pipeline: Any,
    prompts: list[str],
    clients: int,
    requests: int,
    max_tokens: int,
    pairs: int,
    overflow_queue: int,
    threads: int | None,
    timeout_s: float,
    log_dir: Path,
    step: Step,
) -> ServeBenchResult:
    if threads:
        torch.set_num_threads(threads)
    result = ServeBenchResult(
        {
            "clients": clients,
            "requests": requests,
            "max_tokens": max_tokens,
            "pairs": pairs,
            "overflow_queue": overflow_queue,
            "threads": threads,
            "timeout_s": timeout_s,
            "prompts": len(prompts),
            "config": config.name,
        }
    )
    server = start_server(config_path, max_queue=max(clients * requests, 1), threads=threads, log_dir=log_dir)
    try:
        result.overhead = measure_overhead(pipeline, server.url, prompts, max_tokens, pairs, timeout_s, step)
        result.concurrency = measure_concurrency(server.url, prompts, clients, requests, max_tokens, timeout_s, step)
    finally:
        result.concurrency["exit_code"] = server.stop()
    small = start_server(config_path, max_queue=overflow_queue, threads=threads, log_dir=log_dir)
    try:
        result.overflow = measure_overflow(small.url, prompts, clients, requests, max_tokens, timeout_s, step)
    finally:
        result.overflow["exit_code"] = small.stop()
    return result


def total_steps(clients: int, requests: int, pairs: int) -> int:
    return pairs + 3 * clients * requests + clients * requests


REPEATED_CLIENTS = {"greedy": {}, "T=0.5+seed": {"temperature": 0.5}}  # plus a fixed seed per prompt


def run_repeated_through_server(
    config: Config,
    prompts: list[str],
    max_tokens: int,
    threads: int | None,
    timeout_s: float,
    log_dir: Path,
    step: Step,
) -> dict[str, Any]:
    """The prompt set twice through a fresh suffix-drafter server per kind of client; the gain per kind."""
    data = config.model_dump(mode="json", exclude_none=True)  # unset fields stay unset (and keep their defaults)
    data["speculation"]["drafter"] = "suffix"
    suffix_config = log_dir / "suffix.yaml"
    suffix_config.write_text(yaml.safe_dump(data))
    kinds: dict[str, Any] = {}
    for kind, sampling in REPEATED_CLIENTS.items():
        server = start_server(suffix_config, max_queue=1, threads=threads, log_dir=log_dir)
        try:
            passes = [_one_pass(server.url, prompts, max_tokens, sampling, timeout_s, step) for _ in range(2)]
        finally:
            exit_code = server.stop()
        kinds[kind] = {
            "first": passes[0],
            "second": passes[1],
            "exit_code": exit_code,
            "gain": passes[1]["tokens_per_s"] / passes[0]["tokens_per_s"] if passes[0]["tokens_per_s"] else 0.0,
        }
    return {
        "settings": {
            "prompts": len(prompts),
            "max_tokens": max_tokens,
            "threads": threads,
            "config": config.name,
            "drafter": "suffix",
            "clients": REPEATED_CLIENTS,
        },
        "kinds": kinds,
    }


def _one_pass(
    url: str, prompts: list[str], max_tokens: int, sampling: dict[str, Any], timeout_s: float, step: Step
) -> dict[str, Any]:
    """One client, the prompts in order, non-streamed; prompt i samples with seed i in every pass."""
    tokens = calls = errors = 0
    wall = 0.0
    with httpx.Client() as client:
        for i, prompt in enumerate(prompts):
            body = chat_body(prompt, max_tokens, stream=False, sampling={**sampling, "seed": i} if sampling else None)
            start = time.perf_counter()
            r = client.post(f"{url}/v1/chat/completions", json=body, timeout=timeout_s)
            wall += time.perf_counter() - start
            if r.status_code != 200:
                errors += 1
            else:
                answer = r.json()
                tokens += answer["usage"]["completion_tokens"]
                calls += answer["speculative"]["target_calls"]
            step("request")
    return {
        "tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens / wall if wall else 0.0,
        "errors": errors,
        "tokens_per_call": tokens / calls if calls else 0.0,
    }


def prefix_cache_counts(url: str) -> tuple[float, float]:
    """The server's prompt tokens looked up in its prefix cache and found there so far (vLLM's counters)."""
    metrics = httpx.get(f"{url}/metrics", timeout=10).text

    def total(name: str) -> float:
        return sum(float(line.split()[-1]) for line in metrics.splitlines() if line.startswith(name + "{"))

    return total("vllm:prefix_cache_queries_total"), total("vllm:prefix_cache_hits_total")


def hit_rate(before: tuple[float, float], after: tuple[float, float]) -> float:
    """Prompt tokens found in the prefix cache over those looked up, between two `prefix_cache_counts`."""
    queries = after[0] - before[0]
    return (after[1] - before[1]) / queries if queries else 0.0


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
