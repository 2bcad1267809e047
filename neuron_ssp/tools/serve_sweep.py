"""bench-serve --sweep: aggregate throughput and latency per concurrency, three ways of serving side by side.

Three `neuron-ssp serve` processes run the same config on loopback at once, differing only in how they
schedule: batch-1 speculation (one request at a time: the server before continuous batching),
continuous batching without speculation (drafter none), and continuous batching with speculation and
goodput windows (the config's drafter and policy). Every pass serves the same requests: `requests` x the
highest concurrency chat requests (the prompts in file order, cycling), so every c and every server does the
same work and both the columns and the rows of the table compare. At concurrency c, c streaming clients share
them, each sending the next unsent one when its last is answered; one server after the other, the order
rotating with c, so the three see the same machine load. Per server and c: output tokens/s over the pass,
time to first token and time per output token (after the first: (end - first token) / (tokens - 1)) at p50
and p95, and the server process's CPU time per output token (all its threads, read from /proc): on a machine
shared with other jobs the wall-clock figures move with their load, the CPU time much less. Greedy outputs must
be equal across the three servers and every c: batching must not change a token. Each server's exit code on
SIGTERM (0: a clean drain) is part of the result.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from neuron_ssp.config import Config
from neuron_ssp.tools.serve_load import (
    Outcome,
    ServerProcess,
    Step,
    hit_rate,
    percentile,
    prefix_cache_counts,
    serve_requests,
    start_server,
)

CONCURRENCY = (1, 2, 4, 8, 16)
MODES = ("batch-1 speculation", "batching, no speculation", "batching + speculation")


@dataclass
class SweepResult:
    settings: dict[str, Any]
    # mode -> concurrency -> measures
    runs: dict[str, dict[int, dict[str, Any]]] = field(default_factory=dict)
    outputs_differing: int = 0
    exit_codes: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def ratio(self, mode: str, other: str, c: int) -> float:
        base = self.runs[other][c]["output_tokens_per_s"]
        return self.runs[mode][c]["output_tokens_per_s"] / base if base else 0.0

    def cpu_ratio(self, mode: str, other: str, c: int) -> float | None:
        """`ratio` in CPU time: the other server's CPU time per output token over this one's."""
        mine, base = self.runs[mode][c]["cpu_ms_per_token"], self.runs[other][c]["cpu_ms_per_token"]
        return base / mine if mine and base is not None else None


def mode_configs(config: Config, max_batch: int, out_dir: Path) -> dict[str, Path]:
    """One YAML per mode: the config with its serve.max_batch (and drafter) set."""
    paths = {}
    for mode in MODES:
        data = config.model_dump(mode="json", exclude_none=True)
        data["serve"]["max_batch"] = 1 if mode == MODES[0] else max_batch
        # every pass serves the same prompts: a warm prefix cache would make each later pass's prefills vanish, so
        # the levels would not compare; off unless the config asks for it
        data["platform"].setdefault("prefix_cache", False)
        if mode == MODES[1]:
            data["speculation"]["drafter"] = "none"
        paths[mode] = out_dir / f"mode-{MODES.index(mode)}.yaml"
        paths[mode].write_text(yaml.safe_dump(data))
    return paths


def measures(outcomes: list[Outcome], wall_s: float, cpu_s: float | None) -> dict[str, Any]:
    """One pass's figures; `cpu_s`: the server's CPU seconds over the pass (None where it cannot be read)."""
    ok = [o for o in outcomes if o.status == 200 and not o.error]
    per_token = [(o.e2e_s - o.ttft_s) / (o.tokens - 1) for o in ok if o.tokens > 1]
    tokens = sum(o.tokens for o in ok)
    return {
        "requests": len(outcomes),
        "errors": len(outcomes) - len(ok),
        "tokens": tokens,
        "wall_s": wall_s,
        "output_tokens_per_s": tokens / wall_s if wall_s else 0.0,
        "cpu_s": cpu_s,
        "cpu_ms_per_token": 1000.0 * cpu_s / tokens if cpu_s is not None and tokens else None,
        **{f"ttft_p{q}_s": percentile([o.ttft_s for o in ok], q) for q in (50, 95)},
        **{f"tpot_p{q}_s": percentile(per_token, q) for q in (50, 95)},
    }


def sweep_prompts(prompts: list[str], count: int) -> list[str]:
    """The requests every pass serves: `count` prompts in file order, cycling through the file."""
    return [prompts[i % len(prompts)] for i in range(count)]


def timed_pass(
    server: ServerProcess, prompts: list[str], c: int, max_tokens: int, timeout_s: float, step: Step
) -> tuple[list[Outcome], dict[str, Any]]:
    """The requests through one server by c clients: the outcomes in request order and the pass's figures."""
    cpu_before, counts_before = server.cpu_s(), prefix_cache_counts(server.url)
    outcomes, wall = serve_requests(server.url, prompts, c, max_tokens, timeout_s, step)
    cpu_after, counts_after = server.cpu_s(), prefix_cache_counts(server.url)
    cpu = cpu_after - cpu_before if cpu_before is not None and cpu_after is not None else None
    return outcomes, {**measures(outcomes, wall, cpu), "prefix_cache_hit_rate": hit_rate(counts_before, counts_after)}


def run_sweep(
    config: Config,
    prompts: list[str],
    concurrency: tuple[int, ...],
    requests: int,
    max_tokens: int,
    max_batch: int,
    threads: int | None,
    timeout_s: float,
    log_dir: Path,
    step: Step,
) -> SweepResult:
    """`requests` per client at the highest concurrency: every pass serves that many x max(concurrency)."""
    work = sweep_prompts(prompts, requests * max(concurrency))
    result = SweepResult(
        {
            "concurrency": list(concurrency),
            "requests_per_pass": len(work),
            "max_tokens": max_tokens,
            "max_batch": max_batch,
            "threads": threads,
            "prompts": len(prompts),
            "config": config.name,
            "drafter": config.speculation.drafter,
            "policy": config.speculation.policy,
            "prefix_cache": bool(config.platform.prefix_cache),
            "k": config.speculation.k,
        }
    )
    servers: dict[str, ServerProcess] = {}
    try:
        for mode, path in mode_configs(config, max_batch, log_dir).items():
            servers[mode] = start_server(path, max_queue=len(work), threads=threads, log_dir=log_dir)
            step("server")
        texts: list[str | None] = [None] * len(work)  # request -> the first answer seen
        for turn, c in enumerate(concurrency):
            for mode in MODES[turn % len(MODES) :] + MODES[: turn % len(MODES)]:
                outcomes, figures = timed_pass(servers[mode], work, c, max_tokens, timeout_s, step)
                result.runs.setdefault(mode, {})[c] = figures
                for r, outcome in enumerate(outcomes):
                    texts[r] = outcome.text if texts[r] is None else texts[r]
                    result.outputs_differing += outcome.text != texts[r]
    finally:
        for mode, server in servers.items():
            result.exit_codes[mode] = server.stop()
    return result


def total_steps(concurrency: tuple[int, ...], requests: int) -> int:
    return len(MODES) * (1 + len(concurrency) * requests * max(concurrency))


def targets(result: SweepResult) -> list[tuple[str, str, str, bool]]:
    """Issue 41's targets, as (name, measured, goal, met): met is judged on tokens/s over wall time, as the
    issue states them; beside each throughput ratio the same ratio in the servers' CPU time per output token."""
    batch1, plain, spec = MODES
    levels = result.settings["concurrency"]
    rows = []

    def versus(mode: str, other: str, c: int, goal: float, name: str) -> None:
        r, cpu = result.ratio(mode, other, c), result.cpu_ratio(mode, other, c)
        measured = f"{r:.3f}x" + (f" (CPU {cpu:.3f}x)" if cpu is not None else "")
        rows.append((name, measured, f">= {goal}x", r >= goal))

    if 1 in levels:
        versus(spec, batch1, 1, 0.97, "c=1: vs batch-1 speculation")
    if 8 in levels:
        versus(spec, batch1, 8, 5.0, "c=8: vs batch-1 speculation at c=8")
    for c in levels:
        versus(spec, plain, c, 0.95, f"c={c}: vs batching, no speculation")
    if 1 in levels and 8 in levels:
        one, eight = result.runs[spec][1]["tpot_p95_s"], result.runs[spec][8]["tpot_p95_s"]
        rows.append(
            ("c=8 TPOT p95 / c=1", f"{eight / one:.2f}x" if one else "n/a", "<= 2x", bool(one) and eight <= 2 * one)
        )
    rows.append(("greedy outputs differing", str(result.outputs_differing), "0", result.outputs_differing == 0))
    codes = ", ".join(str(code) for code in result.exit_codes.values())
    rows.append(("servers' exit codes", codes, "0", all(code == 0 for code in result.exit_codes.values())))
    return rows
