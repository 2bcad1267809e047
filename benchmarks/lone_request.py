"""One request alone on the batch-1 server's pipeline and on the batching server's, in ONE process (issue 41's c = 1).

The sweep's batching server is slower for a lone request than the batch-1 server; this separates the loop from
the server. Two pipelines of the same config, loaded for max_batch 1 and max_batch 16 (a KV cache of 16 slots,
the call cost timed for 16 x k rows), decode the same short prompts one at a time, interleaved per prompt, with
torch on one thread: CPU time of the thread per output token, target calls and rows per call, the CPU time
inside the target's calls and outside them (the loop's per-step work), and whether the greedy outputs agree.

    python benchmarks/lone_request.py [--prompts 8] [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

from neuron_ssp.config import load_config
from neuron_ssp.pipeline.load import load_pipeline
from neuron_ssp.pipeline.pipeline import Pipeline

PROMPTS = Path(__file__).parent / "serve_prompts_short.jsonl"
MAX_BATCHES = (1, 16)


def record_calls(pipeline: Pipeline) -> list[tuple[int, float]]:
    """Wrap the target's score_batch: every call's rows and thread CPU seconds, appended to the list returned."""
    calls: list[tuple[int, float]] = []
    score_batch = pipeline.target.score_batch

    def timed(segments, *args, **kwargs):
        begin = time.thread_time()
        out = score_batch(segments, *args, **kwargs)
        calls.append((sum(len(segment.tokens) for segment in segments), time.thread_time() - begin))
        return out

    pipeline.target.score_batch = timed
    return calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(1)
    prompts = [json.loads(line)["prompt"] for line in PROMPTS.read_text().splitlines() if line.strip()]
    config = load_config(None, {"generation.max_new_tokens": args.max_tokens})
    pipelines = {batch: load_pipeline(config, batch) for batch in MAX_BATCHES}
    calls = {batch: record_calls(pipeline) for batch, pipeline in pipelines.items()}
    for batch, pipeline in pipelines.items():
        pipeline.speculative(prompts[0], max_new_tokens=8)  # warm-up
        calls[batch].clear()
    cpu = dict.fromkeys(MAX_BATCHES, 0.0)
    tokens = dict.fromkeys(MAX_BATCHES, 0)
    outputs: dict[int, list[list[int]]] = {batch: [] for batch in MAX_BATCHES}
    for prompt in prompts[: args.prompts]:
        for batch, pipeline in pipelines.items():
            begin = time.thread_time()
            result = pipeline.speculative(prompt, max_new_tokens=args.max_tokens)
            cpu[batch] += time.thread_time() - begin
            tokens[batch] += result.result.stats.new_tokens
            outputs[batch].append(list(result.tokens))
    print(
        f"{args.prompts} prompts alone, {args.max_tokens} tokens each, thread CPU time, load average "
        f"{' '.join(f'{load:.2f}' for load in os.getloadavg())}"
    )
    for batch in MAX_BATCHES:
        rows = [count for count, _ in calls[batch]]
        inside = sum(seconds for _, seconds in calls[batch])
        print(
            f"max_batch {batch:>2}: {tokens[batch]} tokens, {1000 * cpu[batch] / tokens[batch]:.1f} ms a token; "
            f"{len(rows)} target calls of {statistics.mean(rows):.2f} rows on average, "
            f"{1000 * inside / len(rows):.1f} ms a call; outside the calls "
            f"{1000 * (cpu[batch] - inside) / tokens[batch]:.2f} ms a token"
        )
    one, batched = MAX_BATCHES
    ratio = (cpu[batched] / tokens[batched]) / (cpu[one] / tokens[one])
    print(
        f"CPU time a token, max_batch {batched} / {one}: {ratio:.3f}x; "
        f"greedy outputs equal: {outputs[one] == outputs[batched]}"
    )


if __name__ == "__main__":
    main()
