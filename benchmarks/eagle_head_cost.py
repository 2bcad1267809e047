"""What an EAGLE-3 head's drafting costs against a target call, in ONE run, on the embedded default model.

A random head of the embedded model's shape (one decoder layer of width 576, fc 3 x 576 -> 576) over a draft
vocabulary of V_d tokens (8192, 16384, 32000 and all 49152), and the target (the compact forward, row kernel where
built) prefilled with --context tokens. Per round, in an order that rotates: a one-token target call with taps
(what every EAGLE step pays on top of plain decoding is the taps' copy: timed beside a call without), a chain step
of the head (one row: decode + logits over V_d, the draft drawn greedily), and the head's catch-up over 4
positions (a step that accepted 3 tokens). Medians after one uncounted round; each cost / the one-token call's.

Two clocks per call: wall time, and the CPU time of the calling thread (`time.thread_time`); with --threads 1 the
whole call runs on that thread, so its CPU time is the call's work whatever else the machine runs.

    python benchmarks/eagle_head_cost.py --threads 1 [--rounds 20] [--context 300]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from neuron_ssp.backends.base import Segment
from neuron_ssp.backends.torch.load import load_torch_backends
from neuron_ssp.config import load_config
from neuron_ssp.drafters.eagle import EagleModel
from neuron_ssp.drafters.eagle_checkpoint import EagleCheckpoint, head_config_for, vocab_maps
from neuron_ssp.drafters.eagle_head import EagleHead

DRAFT_VOCABS = (8192, 16384, 32000, 49152)
CLOCKS = {"CPU time of the calling thread": time.thread_time, "wall time": time.perf_counter}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--context", type=int, default=300)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = load_config(None, {"speculation.drafter": "none", "speculation.policy": "fixed"})
    target, _, _ = load_torch_backends(config, 1)
    context = torch.randint(0, 1000, (args.context,), generator=torch.Generator().manual_seed(0))
    heads = {size: EagleModel(random_head(target, size), target) for size in DRAFT_VOCABS}
    target.prefill_slot(0, context)
    for model in heads.values():
        taps = target.prefill_slot_hidden(0, context)[1]
        model.head.decode(model.head.fuse(taps), context, [(0, 0, args.context)], model.cache)
    calls: dict[str, Callable[[], object]] = {
        "target: 1 token": lambda: target.score_batch([Segment(0, args.context, context[:1])]),
        "target: 1 token + taps": lambda: target.score_batch_hidden(
            [Segment(0, args.context, context[:1], hidden_rows=1)]
        ),
    }
    hidden = torch.zeros(1, 576)
    for size, model in heads.items():
        calls[f"head chain step, V_d {size}"] = chain_step(model, hidden, args.context)
        calls[f"head catch-up of 4, V_d {size}"] = catch_up(model, target, args.context)
    medians = time_calls(calls, args.rounds)
    print(f"embedded model, context {args.context} tokens, {args.threads} thread(s), {args.rounds} rounds, medians")
    for clock, values in medians.items():
        base = values["target: 1 token"]
        print(f"\n{clock}")
        print(f"{'call':36} {'ms':>8} {'÷ target 1 token':>17}")
        for name, ms in values.items():
            print(f"{name:36} {ms:8.3f} {ms / base:17.3f}")


def random_head(target, draft_vocab: int) -> EagleCheckpoint:
    """A head as wide as the target (its config.json is the target's, one layer), random weights, random draft
    vocabulary."""
    config = head_config_for(target.model.config.to_dict(), draft_vocab)
    vocab = config.vocab_size
    maps = vocab_maps(torch.randperm(vocab)[:draft_vocab], vocab) if draft_vocab < vocab else (None, None)
    return EagleHead(config, target.token_embedding()).to_checkpoint(*maps)


def chain_step(model: EagleModel, hidden: torch.Tensor, position: int) -> Callable[[], object]:
    def step() -> int:
        out = model.head.decode(hidden, torch.zeros(1, dtype=torch.long), [(0, position, 1)], model.cache)
        return int(model.draft_ids[model.head.logits(out[-1]).argmax()])

    return step


def catch_up(model: EagleModel, target, position: int) -> Callable[[], object]:
    taps = target.score_batch_hidden([Segment(0, position, torch.arange(4), hidden_rows=4)])[1]
    fused_input = taps.clone()

    def step() -> int:
        out = model.head.decode(model.head.fuse(fused_input), torch.arange(4), [(0, position, 4)], model.cache)
        return int(model.draft_ids[model.head.logits(out[-1]).argmax()])

    return step


@torch.inference_mode()
def time_calls(calls: dict[str, Callable[[], object]], rounds: int) -> dict[str, dict[str, float]]:
    names = list(calls)
    samples: dict[str, dict[str, list[float]]] = {clock: {name: [] for name in names} for clock in CLOCKS}
    for turn in range(rounds + 1):
        for name in names[turn % len(names) :] + names[: turn % len(names)]:
            begin = {clock: read() for clock, read in CLOCKS.items()}
            calls[name]()
            end = {clock: read() for clock, read in CLOCKS.items()}
            if turn:
                for clock in CLOCKS:
                    samples[clock][name].append(1000.0 * (end[clock] - begin[clock]))
    return {clock: {name: statistics.median(values) for name, values in per.items()} for clock, per in samples.items()}


if __name__ == "__main__":
    main()
