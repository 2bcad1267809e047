"""bench-serve --sweep: aggregate throughput and latency per concurrency, three ways of serving side by side.

Three `neuron-ssp serve` processes run the same config on loopback at once, differing only in how they
schedule: batch-1 speculation (one request at a time: the server before continuous batching),
continuous batching without speculation (drafter none), and continuous batching with speculation and
goodput windows (the config's drafter and policy). For each concurrency c, c streaming clients send
`requests` chat requests each to one server, then to the next, the order of the servers rotating with c,
so the three see the same machine load. Per server and c: output tokens/s over the pass, time to first
token and time per output token (after the first: (end - first token) / (tokens - 1)) at p50 and p95.
Greedy outputs must be equal across the three servers and every c: batching must not change a token.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from neuron_ssp.config import Config
from neuron_ssp.tools.serve_load import Outcome, ServerProcess, Step, percentile, run_clients, start_server

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


def mode_configs(config: Config, max_batch: int, out_dir: Path) -> dict[str, Path]:
    """One YAML per mode: the config with its serve.max_batch (and drafter) set."""
    paths = {}
    for mode in MODES:
        data = config.model_dump(mode="json", exclude_none=True)
        data["serve"]["max_batch"] = 1 if mode == MODES[0] else max_batch
        if mode == MODES[1]:
            data["speculation"]["drafter"] = "none"
        paths[mode] = out_dir / f"mode-{MODES.index(mode)}.yaml"
        paths[mode].write_text(yaml.safe_dump(data))
    return paths


def measures(outcomes: list[Outcome], wall_s: float) -> dict[str, Any]:
    ok = [o for o in outcomes if o.status == 200 and not o.error]
    per_token = [(o.e2e_s - o.ttft_s) / (o.tokens - 1) for o in ok if o.tokens > 1]
    return {
        "requests": len(outcomes),
        "errors": len(outcomes) - len(ok),
        "tokens": sum(o.tokens for o in ok),
        "wall_s": wall_s,
        "output_tokens_per_s": sum(o.tokens for o in ok) / wall_s if wall_s else 0.0,
        **{f"ttft_p{q}_s": percentile([o.ttft_s for o in ok], q) for q in (50, 95)},
        **{f"tpot_p{q}_s": percentile(per_token, q) for q in (50, 95)},
    }


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
    result = SweepResult(
        {
            "concurrency": list(concurrency),
            "requests_per_client": requests,
            "max_tokens": max_tokens,
            "max_batch": max_batch,
            "threads": threads,
            "prompts": len(prompts),
            "config": config.name,
            "drafter": config.speculation.drafter,
            "policy": config.speculation.policy,
            "k": config.speculation.k,
        }
    )
    servers: dict[str, ServerProcess] = {}
    try:
        for mode, path in mode_configs(config, max_batch, log_dir).items():
            servers[mode] = start_server(path, max_queue=max(concurrency) * requests, threads=threads, log_dir=log_dir)
            step("server")
        texts: dict[tuple[int, int, int], str] = {}  # (c, client, request) -> the first server's text
        for turn, c in enumerate(concurrency):
            for mode in MODES[turn % len(MODES) :] + MODES[: turn % len(MODES)]:
                outcomes, wall = run_clients(servers[mode].url, prompts, c, requests, max_tokens, timeout_s, step)
                result.runs.setdefault(mode, {})[c] = measures([o for client in outcomes for o in client], wall)
                for client, outs in enumerate(outcomes):
                    for r, outcome in enumerate(outs):
                        first = texts.setdefault((c, client, r), outcome.text)
                        result.outputs_differing += outcome.text != first
    finally:
        for mode, server in servers.items():
            result.exit_codes[mode] = server.stop()
    return result


def total_steps(concurrency: tuple[int, ...], requests: int) -> int:
    return len(MODES) * (1 + sum(c * requests for c in concurrency))


def targets(result: SweepResult) -> list[tuple[str, str, str, bool]]:
    """Issue 34's targets, as (name, measured, goal, met)."""
    batch1, plain, spec = MODES
    levels = result.settings["concurrency"]
    rows = []
    if 1 in levels:
        r = result.ratio(spec, batch1, 1)
        rows.append(("c=1: vs batch-1 speculation", f"{r:.3f}x", ">= 0.97x", r >= 0.97))
    if 8 in levels:
        r = result.ratio(spec, batch1, 8)
        rows.append(("c=8: vs batch-1 speculation", f"{r:.2f}x", ">= 5x", r >= 5.0))
    for c in levels:
        r, goal = result.ratio(spec, plain, c), 1.25 if c <= 2 else (1.0 if c == 8 else 0.95)
        rows.append((f"c={c}: vs batching, no speculation", f"{r:.3f}x", f">= {goal}x", r >= goal))
    if 1 in levels and 8 in levels:
        one, eight = result.runs[spec][1]["tpot_p95_s"], result.runs[spec][8]["tpot_p95_s"]
        rows.append(
            ("c=8 TPOT p95 / c=1", f"{eight / one:.2f}x" if one else "n/a", "<= 2x", bool(one) and eight <= 2 * one)
        )
    rows.append(("greedy outputs differing", str(result.outputs_differing), "0", result.outputs_differing == 0))
    return rows
