"""The KV cache in bfloat16 against float32 (platform.kv_dtype), on the embedded default target: what the logits
lose, and what a batch's call gains, in ONE run.

Agreement: for each prompt of one half of the dev set (per category, even positions: choose; odd: report), plain
greedy decoding with a float32 cache gives --max-tokens tokens; the prompt and those tokens are then scored by a
backend of each cache dtype in the same calls (the prompt's prefill, then every generated token in one call), so
both see the same contexts. Per position: whether the argmax agrees, and the largest absolute logit difference.
Also whether plain greedy decoding with the bfloat16 cache gives the same tokens, and where it first differs.

Speed: one call of 8 requests decoding one token each after --context tokens (8 slots x 1 row) and one call of
one request decoding one token, each cache dtype, timed in interleaved rounds in CPU time of the calling thread
(--threads 1), medians.

    python benchmarks/kv_dtype.py --half choose [--max-tokens 64] [--context 500] [--rounds 10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from transformers import PreTrainedTokenizerBase

from neuron_ssp.backends.base import Segment
from neuron_ssp.backends.torch.load import KV_DTYPES, load_torch_backends
from neuron_ssp.backends.torch.scoring import TorchBackend
from neuron_ssp.config import SamplingConfig, load_config
from neuron_ssp.engines.native import plain_generate
from neuron_ssp.pipeline.prompts import encode_prompt
from neuron_ssp.tools.prompt_set import DEFAULT_PROMPTS, HALVES, by_category, load_prompts

GREEDY = SamplingConfig(temperature=0.0)


@torch.inference_mode()
def teacher_forced(backend: TorchBackend, prompt: torch.Tensor, tokens: list[int]) -> torch.Tensor:
    """The logits before each generated token: the prompt's last, then one call over the tokens but the last."""
    first = backend.prefill(prompt).view(1, -1)
    rest = backend.score(torch.tensor(tokens[:-1]), len(prompt)) if len(tokens) > 1 else first[:0]
    return torch.cat([first, rest])


def agreement(
    model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, half: str, max_tokens: int, n_positions: int
) -> dict[str, object]:
    prompts = [p for group in by_category(load_prompts(DEFAULT_PROMPTS), half=half).values() for p in group]
    backends = {name: TorchBackend(model, n_positions, kv_dtype=dtype) for name, dtype in KV_DTYPES.items()}
    agree = positions = same_outputs = 0
    largest = 0.0
    first_differences: list[int] = []
    for prompt in prompts:
        ids = encode_prompt(tokenizer, prompt.text, True)
        reference = plain_generate(backends["float32"], ids, max_tokens, GREEDY).tokens
        full = teacher_forced(backends["float32"], ids, reference)
        half_logits = teacher_forced(backends["bfloat16"], ids, reference)
        agree += int((full.argmax(-1) == half_logits.argmax(-1)).sum())
        positions += full.shape[0]
        largest = max(largest, float((full - half_logits).abs().max()))
        ours = plain_generate(backends["bfloat16"], ids, max_tokens, GREEDY).tokens
        same_outputs += ours == reference
        if ours != reference:
            pairs = enumerate(zip(ours, reference, strict=False))
            first_differences.append(next((i for i, (a, b) in pairs if a != b), min(len(ours), len(reference))))
    return {
        "prompts": len(prompts),
        "positions": positions,
        "argmax_agreement": agree / positions,
        "largest_logit_difference": largest,
        "greedy_outputs_equal": same_outputs,
        "first_differences": first_differences,
    }


@torch.inference_mode()
def call_costs(model: torch.nn.Module, prompt: torch.Tensor, rounds: int) -> dict[str, dict[str, float]]:
    """Median CPU ms of 8 slots x 1 row and of 1 row, per cache dtype, after one uncounted round."""
    context = prompt.shape[0]
    backends = {name: TorchBackend(model, context + 8, slots=8, kv_dtype=dtype) for name, dtype in KV_DTYPES.items()}
    for backend in backends.values():
        for slot in range(backend.slots):
            backend.prefill_slot(slot, prompt)
    shapes = {"8 slots x 1 row": 8, "1 row": 1}
    samples: dict[tuple[str, str], list[float]] = {(n, s): [] for n in backends for s in shapes}
    for turn in range(rounds + 1):
        for name in list(backends)[turn % 2 :] + list(backends)[: turn % 2]:
            for shape, slots in shapes.items():
                segments = [Segment(slot, context, torch.tensor([17])) for slot in range(slots)]
                begin = time.thread_time()
                backends[name].score_batch(segments)
                if turn:
                    samples[name, shape].append(1000.0 * (time.thread_time() - begin))
    return {name: {shape: statistics.median(samples[name, shape]) for shape in shapes} for name in backends}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--half", choices=HALVES, required=True)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--context", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target, _, tokenizer = load_torch_backends(load_config(None))
    load = os.getloadavg()[0]
    result = agreement(target.model, tokenizer, args.half, args.max_tokens, target.n_positions)
    print(
        f"{args.half} half of the dev prompts, {args.max_tokens} greedy tokens each, bfloat16 cache against float32: "
        f"{result['prompts']} prompts, {result['positions']} positions; argmax agreement "
        f"{result['argmax_agreement']:.4f}; largest logit difference {result['largest_logit_difference']:.4f}; "
        f"greedy outputs equal {result['greedy_outputs_equal']} of {result['prompts']} "
        f"(first differences at tokens {result['first_differences']})"
    )
    text = " ".join(prompt.text for prompt in load_prompts(DEFAULT_PROMPTS))
    context = tokenizer(text, return_tensors="pt").input_ids[0][: args.context]
    costs = call_costs(target.model, context, args.rounds)
    print(
        f"CPU time of one call after {args.context} tokens, median of {args.rounds} rounds, "
        f"{torch.get_num_threads()} thread(s), load average {load:.2f} before, {os.getloadavg()[0]:.2f} after:"
    )
    for name, by_shape in costs.items():
        print(f"  {name:>8}: " + ", ".join(f"{shape} {ms:.1f} ms" for shape, ms in by_shape.items()))
    eight = costs["bfloat16"]["8 slots x 1 row"] / costs["float32"]["8 slots x 1 row"]
    one = costs["bfloat16"]["1 row"] / costs["float32"]["1 row"]
    print(f"  bfloat16 / float32: 8 slots x 1 row {eight:.3f}x, 1 row {one:.3f}x")


if __name__ == "__main__":
    main()
