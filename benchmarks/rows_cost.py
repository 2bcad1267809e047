"""What one batched target call costs per row count and per number of sequences in it, in ONE run.

One TorchBackend over the embedded default model (or --config's target), holding 8 sequences, each prefilled
with the same --context tokens. A call scores R rows (1, 2, 4, ..., 64) spread evenly over S segments (1, 2,
4, 8: S requests, each scoring R/S tokens after its context; 8 segments of 1 row = 8 requests decoding one
token each). Every call writes the positions right after each slot's context, so every call sees the same
context (rollback by position). Each round times every (R, S) once, the order rotating per round; the tables
give medians and each cost ÷ the 1-row call's: what a batch pays over one request decoding alone.

Two clocks per call: wall time, and the CPU time of the thread that makes the call (`time.thread_time`). With
--threads 1 the whole call runs on that thread, so its CPU time is the call's work whatever else the machine
runs; on a shared machine the wall time also holds the time other processes took the core.

    python benchmarks/rows_cost.py --threads 1 [--rounds 10] [--context 500] [--kv-dtype bfloat16]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from neuron_ssp.backends.base import Segment
from neuron_ssp.backends.torch.load import KV_DTYPES, gguf_blocks, load_torch_backends
from neuron_ssp.backends.torch.scoring import TorchBackend
from neuron_ssp.config import load_config
from neuron_ssp.tools.prompt_set import DEFAULT_PROMPTS, load_prompts

ROWS = (1, 2, 4, 8, 16, 32, 64)
SEGMENTS = (1, 2, 4, 8)
CLOCKS = {"CPU time of the calling thread": time.thread_time, "wall time": time.perf_counter}


def shapes() -> list[tuple[int, int]]:
    """Every (rows, segments) with at least one row a segment."""
    return [(rows, segments) for rows in ROWS for segments in SEGMENTS if rows >= segments]


def call(rows: int, segments: int, context: int) -> list[Segment]:
    """`segments` requests of rows/segments tokens each, on slots 0.., right after their context."""
    width = rows // segments
    return [Segment(slot, context, torch.randint(0, 1000, (width,))) for slot in range(segments)]


@torch.inference_mode()
def time_calls(backend: TorchBackend, context: int, rounds: int) -> dict[str, dict[tuple[int, int], float]]:
    """Median milliseconds of one call per (rows, segments) on each clock, after one uncounted round."""
    order = shapes()
    samples: dict[str, dict[tuple[int, int], list[float]]] = {clock: {shape: [] for shape in order} for clock in CLOCKS}
    for turn in range(rounds + 1):
        for shape in order[turn % len(order) :] + order[: turn % len(order)]:
            segments = call(*shape, context)
            begin = {clock: read() for clock, read in CLOCKS.items()}
            backend.score_batch(segments)
            end = {clock: read() for clock, read in CLOCKS.items()}
            if turn:
                for clock in CLOCKS:
                    samples[clock][shape].append(1000.0 * (end[clock] - begin[clock]))
    return {clock: {shape: statistics.median(times) for shape, times in per.items()} for clock, per in samples.items()}


def table(ms: dict[tuple[int, int], float]) -> None:
    one = ms[1, 1]
    print(f"{'rows':>5} " + "".join(f"{f'{s} segment' + ('s' if s > 1 else ''):>22}" for s in SEGMENTS))
    for rows in ROWS:
        cells = [
            f"{ms[rows, s]:>9.1f} ms {ms[rows, s] / one:>6.2f}x" if (rows, s) in ms else f"{'-':>22}" for s in SEGMENTS
        ]
        print(f"{rows:>5} " + "".join(cells))


def batch_ratios(ms: dict[tuple[int, int], float]) -> str:
    """Issue 41's targets: 8 requests decoding one token each against one request scoring 8 rows, and
    against one request decoding alone."""
    return (
        f"8 slots x 1 row / 1 slot x 8 rows {ms[8, 8] / ms[8, 1]:.3f}x, "
        f"8 slots x 1 row / 1 row {ms[8, 8] / ms[1, 1]:.3f}x"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="YAML config (default: the embedded default)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--context", type=int, default=500, help="tokens in each slot before the timed calls")
    parser.add_argument("--kv-dtype", choices=sorted(KV_DTYPES), help="the cache's dtype (default: the config's)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = load_config(args.config, {"platform.kv_dtype": args.kv_dtype} if args.kv_dtype else {})
    target, _, tokenizer = load_torch_backends(config)
    text = " ".join(prompt.text for prompt in load_prompts(DEFAULT_PROMPTS))
    prompt = tokenizer(text, return_tensors="pt").input_ids[0][: args.context]
    if prompt.shape[0] < args.context:
        raise SystemExit(f"the prompts give {prompt.shape[0]} tokens, fewer than --context {args.context}")
    kv_dtype = KV_DTYPES[config.platform.kv_dtype]
    blocks = gguf_blocks(config, config.target, target.model, torch.device("cpu"))  # platform.weights auto
    backend = TorchBackend(
        target.model, args.context + max(ROWS), pack=None, slots=max(SEGMENTS), kv_dtype=kv_dtype, blocks=blocks
    )
    for slot in range(backend.slots):
        backend.prefill_slot(slot, prompt)
    load_before = os.getloadavg()[0]
    clocks = time_calls(backend, args.context, args.rounds)
    layout = getattr(backend._forward, "w", None)
    print(
        f"one call of R rows over S segments after {args.context} tokens of context in each slot, "
        f"{backend.forward_name} forward ({layout.layout if layout else 'hf'}"
        f"{', GGUF blocks' if backend.weights_from_blocks else ''}), {config.platform.kv_dtype} cache, "
        f"median of {args.rounds} rounds, "
        f"{torch.get_num_threads()} thread(s); x = ÷ the 1-row call; load average {load_before:.2f} before, "
        f"{os.getloadavg()[0]:.2f} after"
    )
    for clock, ms in clocks.items():
        print(f"\n{clock}: {batch_ratios(ms)}")
        table(ms)


if __name__ == "__main__":
    main()
