"""Suffix drafter cost: time per drafting step and memory per stored token, at 32k and 1M tokens of history.

The history is synthetic but shaped like a serving workload: requests of 400-600 tokens whose words
follow a Zipf law over a 49152-token vocabulary (SmolLM2's), and where 30 % of the text is copied
from an earlier request in spans of 8-64 tokens (templates, quoted context, repeated answers).
A step is what the generator asks of the drafter per target call: fold the newly committed tokens
into the request's own tree, then propose up to 7 tokens from both sources. The request being
drafted is a fresh one built the same way, so the history has something to say about it.

With `--arctic DIR` (a directory holding the `_C` module built from the arctic-inference sdist's
csrc/suffix_decoding), the same history goes into ArcticInference's C++ tree as well, and the
script prints its time per speculate call and how often its draft equals ours (global source only).

    python benchmarks/suffix_speed.py [--sizes 32000,1000000] [--arctic /tmp/arctic/build]
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import time

import torch

from neuron_ssp.config import SuffixConfig
from neuron_ssp.drafters import SuffixDrafter, SuffixHistory

VOCAB = 49152
DRAFT = 7
MEAN_COPY = 36  # copied spans are 8-64 tokens long
COPY_CHANCE = 0.3 / (0.7 * MEAN_COPY + 0.3)  # per position: makes copies ~30 % of all tokens


def workload(total: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    weights = [1.0 / (rank + 1) for rank in range(VOCAB)]
    cumulative = list(_accumulate(weights))
    requests: list[list[int]] = []
    stored = 0
    while stored < total:
        request: list[int] = []
        size = rng.randrange(400, 600)
        while len(request) < size:
            if requests and rng.random() < COPY_CHANCE:
                source = rng.choice(requests[-200:])
                start = rng.randrange(len(source))
                request += source[start : start + rng.randrange(8, 65)]
            else:
                request.append(_draw(rng, cumulative))
        requests.append(request[:size])
        stored += size
    return requests


def _accumulate(weights: list[float]):
    total = 0.0
    for w in weights:
        total += w
        yield total


def _draw(rng: random.Random, cumulative: list[float]) -> int:
    import bisect

    return bisect.bisect_left(cumulative, rng.random() * cumulative[-1])


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def measure(size: int, settings: SuffixConfig, arctic_dir: str | None) -> None:
    requests = workload(size + 12_000, seed=size)
    held_out, history_requests = requests[-20:], requests[:-20]
    gc.collect()
    before = rss_bytes()
    history = SuffixHistory(settings)
    start = time.perf_counter()
    for request in history_requests:
        history.add(request)
    build_s = time.perf_counter() - start
    gc.collect()
    used = rss_bytes() - before
    stored = history.stored_tokens
    nodes, leaves = history.tree.node_count()
    print(
        f"history {stored} tokens ({len(history_requests)} requests): insert {stored / build_s:,.0f} tokens/s; "
        f"memory {used / stored:.0f} B per stored token ({used / 2**20:.0f} MiB; {nodes:,} nodes, "
        f"{leaves:,} leaves)"
    )

    drafter = SuffixDrafter(VOCAB, settings, history)
    steps: list[float] = []
    cpu: list[float] = []
    trees: list[float] = []
    drafted = 0
    for request in held_out:
        prompt, output = request[:300], request[300:]
        drafter.begin(torch.tensor(prompt), len(output))
        committed = list(prompt)
        i = 0
        while i < len(output):
            seq = torch.tensor(committed)
            t0, c0 = time.perf_counter(), time.thread_time()
            draft = drafter.propose(seq, DRAFT)
            steps.append(time.perf_counter() - t0)
            cpu.append(time.thread_time() - c0)
            t1 = time.thread_time()
            drafter.best_path(committed[-settings.max_depth :], DRAFT)
            trees.append(time.thread_time() - t1)
            drafted += len(draft)
            good = 0
            while good < len(draft) and i + good < len(output) and int(draft.tokens[good]) == output[i + good]:
                good += 1
            committed += output[i : i + good + 1]
            i += good + 1
        drafter.begin(torch.tensor(prompt), len(output))  # leave the history as it was: measure drafting only
    print(
        f"  drafting step (propose: fold new tokens in, search both trees, build the Draft), over {len(steps)} "
        f"steps, {drafted / len(steps):.2f} tokens drafted per step:"
    )
    for label, values in (("wall", steps), ("cpu", cpu), ("cpu, tree search only", trees)):
        ms = sorted(1000 * v for v in values)
        print(
            f"    {label:22s} mean {statistics.mean(ms):.3f} ms, median {statistics.median(ms):.3f} ms, "
            f"p99 {ms[int(0.99 * len(ms))]:.3f} ms"
        )
    if arctic_dir:
        compare_arctic(arctic_dir, history, history_requests, held_out, settings)


def compare_arctic(
    arctic_dir: str,
    history: SuffixHistory,
    history_requests: list[list[int]],
    held_out: list[list[int]],
    settings: SuffixConfig,
) -> None:
    sys.path.insert(0, arctic_dir)
    import _C  # noqa: PLC0415  (ArcticInference's nanobind module, built by hand)

    gc.collect()
    before = rss_bytes()
    tree = _C.SuffixTree(settings.max_depth)
    start = time.perf_counter()
    for sid, request in enumerate(history_requests):
        tree.extend(sid, request)
    build_s = time.perf_counter() - start
    used = rss_bytes() - before
    stored = sum(len(r) for r in history_requests)
    ours_ms, theirs_ms, same, prefix, total = [], [], 0, 0, 0
    for request in held_out:
        for end in range(300, len(request), 3):
            context = request[max(0, end - settings.max_depth) : end]
            t0 = time.perf_counter()
            mine = history.speculate(context, DRAFT)
            t1 = time.perf_counter()
            draft = tree.speculate(context, DRAFT, settings.max_spec_factor, 0.0, settings.min_token_prob, False)
            t2 = time.perf_counter()
            ours_ms.append(1000 * (t1 - t0))
            theirs_ms.append(1000 * (t2 - t1))
            theirs = list(draft.token_ids)
            if not mine.tokens and not theirs:
                continue  # neither drafts: not counted as agreement
            total += 1
            same += mine.tokens == theirs
            prefix += bool(mine.tokens) and bool(theirs) and mine.tokens[0] == theirs[0]
    print(
        f"  arctic-inference C++ tree: insert {stored / build_s:,.0f} tokens/s, memory {used / stored:.0f} B per "
        f"token; speculate mean {statistics.mean(theirs_ms):.4f} ms vs ours (global source only) "
        f"{statistics.mean(ours_ms):.4f} ms; where either drafts: identical drafts {same}/{total} "
        f"({same / total:.0%}), same first token {prefix}/{total}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="32000,1000000", help="history sizes in tokens, comma-separated")
    parser.add_argument("--arctic", help="directory holding ArcticInference's built _C module")
    args = parser.parse_args()
    torch.set_num_threads(1)  # OpenMP threads spinning on a shared machine would bill their wait to the step
    settings = SuffixConfig(cache_tokens=10**9)
    for size in (int(s) for s in args.sizes.split(",")):
        measure(size, settings, args.arctic)


if __name__ == "__main__":
    main()
