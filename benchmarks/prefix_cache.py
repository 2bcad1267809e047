"""Prefix caching through the server, with and without it, side by side in one run (issue 48's targets).

Two `neuron-ssp serve` processes on loopback, the same config but `platform.prefix_cache` true and false, one
thread each, take the same requests in turn (never both at once), streamed, greedy, timed from the client's side:

1. chats: each opens with a ~1k-token system prompt (passages of the benchmark's RAG prompts) and goes on for
   five user turns (the benchmark's QA questions), each turn carrying the conversation so far with the server's
   own answers. Target: with the cache, the time to first token of turns 2-5 <= 0.2x turn 1's.
2. users: eight users at once, one ~1k-token system prompt shared, each its own question, then a second question
   each (two waves, a wave on one server then the same wave on the other). Target: with the cache, TTFT p50 <=
   0.3x the same run without it.

Greedy answers must be the same with and without the cache. The server's /metrics give the hit rate
(vllm:prefix_cache_hits / vllm:prefix_cache_queries) and the pool's bytes.

    python benchmarks/prefix_cache.py [--chats 2] [--json out.json] [--plot docs/prefix_cache.png]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from neuron_ssp.tools.serve_load import (
    Outcome,
    ServerProcess,
    percentile,
    prefix_cache_counts,
    start_server,
    stream_body,
)

HERE = Path(__file__).parent
PROMPTS = [json.loads(line) for line in (HERE / "prompts_more.jsonl").read_text().splitlines()]
SYSTEM_CHARS = 4200  # ~1k tokens of English for the SmolLM2 tokenizer (the script prints the count)
MAX_TOKENS = 32
TURNS, USERS = 5, 8


def system_prompt(offset: int) -> str:
    """Passages of the RAG prompts from the `offset`-th on, up to SYSTEM_CHARS, as a retrieval system prompt."""
    passages = [p["prompt"] for p in PROMPTS if p["category"] == "rag"]
    text = "Answer the user from the documents below, briefly.\n\n"
    for passage in passages[offset:] + passages[:offset]:
        if len(text) >= SYSTEM_CHARS:
            break
        text += passage + "\n\n"
    return text[:SYSTEM_CHARS]


QUESTIONS = [p["prompt"] for p in PROMPTS if p["category"] == "qa"]


def ask(client: httpx.Client, server: ServerProcess, messages: list[dict[str, str]]) -> Outcome:
    body = {
        "messages": messages,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    outcome = stream_body(client, server.url, body, timeout_s=600)
    if outcome.status != 200 or outcome.error:
        raise RuntimeError(f"{server.url}: {outcome.status} {outcome.error}")
    return outcome


def chats(servers: dict[str, ServerProcess], count: int, progress: Progress) -> dict[str, list[list[Outcome]]]:
    """`count` chats of TURNS turns, each turn sent to one server, then the other."""
    task = progress.add_task("chats", total=count * TURNS * len(servers))
    ttft: dict[str, list[list[Outcome]]] = {name: [] for name in servers}
    with httpx.Client() as client:
        for chat in range(count):
            history = {name: [{"role": "system", "content": system_prompt(chat)}] for name in servers}
            for name in servers:
                ttft[name].append([])
            for turn in range(TURNS):
                question = QUESTIONS[(chat * TURNS + turn) % len(QUESTIONS)]
                for name, server in servers.items():
                    history[name].append({"role": "user", "content": question})
                    outcome = ask(client, server, history[name])
                    history[name].append({"role": "assistant", "content": outcome.text})
                    ttft[name][chat].append(outcome)
                    progress.advance(task)
    return ttft


def users(servers: dict[str, ServerProcess], progress: Progress) -> dict[str, list[Outcome]]:
    """USERS users at once with one system prompt, two waves of questions; each wave on one server, then the other."""
    system = system_prompt(7)
    task = progress.add_task("users", total=2 * USERS * len(servers))
    outcomes: dict[str, list[Outcome]] = {name: [] for name in servers}
    for wave in range(2):
        for name, server in servers.items():
            answers: list[Outcome | None] = [None] * USERS

            def one(user: int, question: str, server: ServerProcess = server, answers: list = answers) -> None:
                with httpx.Client() as client:
                    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
                    answers[user] = ask(client, server, messages)
                progress.advance(task)

            questions = [QUESTIONS[(wave * USERS + user + 3) % len(QUESTIONS)] for user in range(USERS)]
            threads = [threading.Thread(target=one, args=(user, questions[user])) for user in range(USERS)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(1200)
            if any(answer is None for answer in answers):
                raise RuntimeError(f"{server.url}: a user got no answer within 1200 s")
            outcomes[name] += [answer for answer in answers if answer is not None]
    return outcomes


def scraped(server: ServerProcess) -> dict[str, float]:
    queries, hits = prefix_cache_counts(server.url)
    metrics = httpx.get(f"{server.url}/metrics", timeout=10).text
    pool = [
        float(line.split()[-1]) for line in metrics.splitlines() if line.startswith("neuron_ssp_prefix_pool_bytes ")
    ]
    return {"queries": queries, "hits": hits, "pool_bytes": pool[0] if pool else 0.0}


def prompt_tokens(server: ServerProcess, offset: int) -> int:
    body = {"messages": [{"role": "system", "content": system_prompt(offset)}]}
    return int(httpx.post(f"{server.url}/tokenize", json=body, timeout=60).json()["count"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chats", type=int, default=2)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--plot", type=Path)
    args = parser.parse_args()
    console = Console()
    work = Path(tempfile.mkdtemp(prefix="prefix-cache-"))
    configs = {"cache": "platform:\n  prefix_cache: true\n", "no cache": "platform:\n  prefix_cache: false\n"}
    servers: dict[str, ServerProcess] = {}
    try:
        for name, text in configs.items():
            path = work / f"{name.replace(' ', '_')}.yaml"
            path.write_text(text + "serve:\n  max_batch: 8\n")
            servers[name] = start_server(path, max_queue=16, threads=1, log_dir=work)
        console.print(
            f"system prompts: {prompt_tokens(servers['cache'], 0)} and {prompt_tokens(servers['cache'], 7)} tokens"
        )
        with Progress(console=console) as progress:
            chat_outcomes = chats(servers, args.chats, progress)
            user_outcomes = users(servers, progress)
        metrics = {name: scraped(server) for name, server in servers.items()}
    finally:
        codes = {name: server.stop() for name, server in servers.items()}
    report = summarise(chat_outcomes, user_outcomes, metrics, codes)
    show(console, report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    if args.plot:
        plot(report, args.plot)
    return 0 if report["same_answers"] and all(code == 0 for code in codes.values()) else 1


def summarise(
    chat_outcomes: dict[str, list[list[Outcome]]],
    user_outcomes: dict[str, list[Outcome]],
    metrics: dict[str, dict[str, float]],
    codes: dict[str, int],
) -> dict[str, Any]:
    turns = {
        name: [statistics.median(chat[turn].ttft_s for chat in chat_list) for turn in range(TURNS)]
        for name, chat_list in chat_outcomes.items()
    }
    later = {name: max(values[1:]) / values[0] for name, values in turns.items()}
    p50 = {name: percentile([o.ttft_s for o in outcomes], 50) for name, outcomes in user_outcomes.items()}
    texts = {
        name: [o.text for chat in chat_outcomes[name] for o in chat] + [o.text for o in user_outcomes[name]]
        for name in chat_outcomes
    }
    cache = metrics["cache"]
    return {
        "turn_ttft_s": turns,
        "worst_later_turn_over_turn_1": later,
        "turn_target_met": later["cache"] <= 0.2,
        "users_ttft_p50_s": p50,
        "users_ttft_by_wave_s": {
            name: [[o.ttft_s for o in outcomes[:USERS]], [o.ttft_s for o in outcomes[USERS:]]]
            for name, outcomes in user_outcomes.items()
        },
        "users_p50_ratio": p50["cache"] / p50["no cache"],
        "users_target_met": p50["cache"] / p50["no cache"] <= 0.3,
        "cached_tokens_per_turn": [[o.cached_tokens for o in chat] for chat in chat_outcomes["cache"]],
        "hit_rate": cache["hits"] / cache["queries"] if cache["queries"] else 0.0,
        "pool_mb": cache["pool_bytes"] / 2**20,
        "metrics": metrics,
        "same_answers": texts["cache"] == texts["no cache"],
        "exit_codes": codes,
    }


def show(console: Console, report: dict[str, Any]) -> None:
    table = Table(title="time to first token by turn (median over the chats), s")
    table.add_column("server")
    for turn in range(TURNS):
        table.add_column(f"turn {turn + 1}", justify="right")
    table.add_column("worst of 2-5 / turn 1", justify="right")
    for name, values in report["turn_ttft_s"].items():
        worst = report["worst_later_turn_over_turn_1"][name]
        table.add_row(name, *(f"{v:.3f}" for v in values), f"{worst:.3f}x")
    console.print(table)
    p50 = report["users_ttft_p50_s"]
    console.print(
        f"{USERS} users, one system prompt, 2 waves: TTFT p50 {p50['cache']:.3f} s with the cache, "
        f"{p50['no cache']:.3f} s without: {report['users_p50_ratio']:.3f}x (target <= 0.3x: "
        f"{'met' if report['users_target_met'] else 'not met'})"
    )
    console.print(
        f"turns 2-5 <= 0.2x turn 1: {'met' if report['turn_target_met'] else 'not met'}; hit rate "
        f"{report['hit_rate']:.3f} of prompt tokens; pool {report['pool_mb']:.1f} MB; same answers: "
        f"{report['same_answers']}; exit codes {report['exit_codes']}"
    )


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (turns_axis, users_axis) = plt.subplots(1, 2, figsize=(10, 4))
    for name, values in report["turn_ttft_s"].items():
        turns_axis.plot(range(1, TURNS + 1), values, marker="o", label=name)
    turns_axis.set(xlabel="turn", ylabel="time to first token (s)", title="a chat, ~1k-token system prompt")
    turns_axis.legend()
    names = list(report["users_ttft_p50_s"])
    users_axis.bar(names, [report["users_ttft_p50_s"][n] for n in names])
    users_axis.set(ylabel="TTFT p50 (s)", title=f"{USERS} users, one system prompt")
    figure.tight_layout()
    figure.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
