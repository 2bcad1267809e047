"""The embedded model on its GGUF's own blocks against its fp32 copy, and llama.cpp on the same file, in one run.

Per prompt (a half of the dev prompts: `--half choose|report`, even or odd positions within each category), greedy,
one thread, these run back to back in an order that rotates from prompt to prompt:
- fp32 plain: plain decoding through the row kernel on the de-quantised fp32 weights (platform.weights fp32);
- blocks plain: the same on the Q4_1/Q8_0 blocks (platform.weights auto);
- blocks SSp: the default speculation on the blocks;
- llama.cpp plain: llama-cpp-python on the same .gguf file, where it is installed (otherwise skipped, saying why).
Decode tokens/s = tokens after the first / thread CPU time after the first token (the prompt's prefill is left
out); end to end = all tokens / all the CPU time. Our three must give the same tokens. The ratios are the issue's
targets: blocks plain / fp32 plain >= 2.0x, blocks SSp / blocks plain >= 1.4x, blocks SSp / llama.cpp plain >= 1.5x.

    python benchmarks/block_weights.py --half report [--nb-prompts 12] [--max-new-tokens 96] [--json out.json]

llama-cpp-python builds llama.cpp from source; its default build crashes on CPUs that advertise AMX, so build it
without: CMAKE_ARGS="-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF" pip install --no-binary
llama-cpp-python llama-cpp-python==0.3.36
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from neuron_ssp.config import load_config
from neuron_ssp.embedded.models import embedded_gguf
from neuron_ssp.engines.native import plain_generate
from neuron_ssp.pipeline.load import load_pipeline
from neuron_ssp.tools.prompt_set import by_category, half_of, load_prompts

Run = Callable[[torch.Tensor, int], tuple[list[int], float, float]]  # ids, budget -> tokens, first-token s, total s


def timed(generate: Callable[[torch.Tensor, int, Callable[[list[int]], None]], list[int]]) -> Run:
    """A generation timed in this thread's CPU time: (tokens, CPU seconds to the first token, CPU seconds in all)."""

    def run(ids: torch.Tensor, budget: int) -> tuple[list[int], float, float]:
        start = time.thread_time()
        first: list[float] = []

        def heard(tokens: list[int]) -> None:
            if not first:
                first.append(time.thread_time() - start)

        tokens = generate(ids, budget, heard)
        return tokens, first[0] if first else 0.0, time.thread_time() - start

    return run


def our_systems() -> tuple[dict[str, Run], Any]:
    fp32 = load_pipeline(load_config(overrides={"sampling.temperature": 0.0, "platform.weights": "fp32"}))
    blocks = load_pipeline(load_config(overrides={"sampling.temperature": 0.0, "platform.weights": "auto"}))
    if not blocks.target.weights_from_blocks:
        sys.exit("platform.weights auto did not read the GGUF's blocks here (no row kernel?): nothing to compare")

    def plain(pipeline: Any) -> Run:
        def generate(ids: torch.Tensor, budget: int, heard: Callable[[list[int]], None]) -> list[int]:
            config = pipeline.config
            return plain_generate(pipeline.target, ids, budget, config.sampling, pipeline.eos_token_ids, heard).tokens

        return timed(generate)

    def speculative(ids: torch.Tensor, budget: int, heard: Callable[[list[int]], None]) -> list[int]:
        return blocks.generator.generate(ids, budget, blocks.eos_token_ids, heard).tokens

    return {"fp32 plain": plain(fp32), "blocks plain": plain(blocks), "blocks SSp": timed(speculative)}, blocks


def llama_cpp_system(eos: set[int]) -> tuple[Run | None, str]:
    try:
        from llama_cpp import Llama
    except ImportError:
        return None, "llama-cpp-python is not installed (see this script's docstring to build it)"
    gguf = embedded_gguf("embedded:smollm2-135m-instruct")
    model = Llama(str(gguf), n_ctx=2048, n_threads=1, n_threads_batch=1, verbose=False)

    def generate(ids: torch.Tensor, budget: int, heard: Callable[[list[int]], None]) -> list[int]:
        model.reset()
        tokens: list[int] = []
        for token in model.generate(ids.tolist(), temp=0.0, top_k=1, reset=True):
            heard([token])
            if token in eos:
                break
            tokens.append(token)
            if len(tokens) == budget:
                break
        return tokens

    return timed(generate), f"llama-cpp-python on {gguf.name}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--half", choices=("choose", "report"), required=True)
    parser.add_argument("--nb-prompts", type=int, default=12)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)
    systems, pipeline = our_systems()
    peer, peer_note = llama_cpp_system(pipeline.eos_token_ids)
    if peer is not None:
        systems["llama.cpp plain"] = peer
    print(f"peer: {peer_note}")
    grouped = half_of(by_category(load_prompts()), args.half)
    prompts = [p for group in zip(*grouped.values(), strict=False) for p in group][: args.nb_prompts]
    names = list(systems)
    totals = {name: {"tokens": 0, "decode_tokens": 0, "decode_s": 0.0, "total_s": 0.0} for name in names}
    differing = 0
    for index, prompt in enumerate(prompts):
        ids = pipeline.encode(prompt.text)
        order = names[index % len(names) :] + names[: index % len(names)]
        outputs = {}
        for name in order:
            tokens, first_s, total_s = systems[name](ids, args.max_new_tokens)
            outputs[name] = tokens
            t = totals[name]
            t["tokens"] += len(tokens)
            t["decode_tokens"] += max(len(tokens) - 1, 0)
            t["decode_s"] += total_s - first_s
            t["total_s"] += total_s
        ours = [outputs[n] for n in names if n != "llama.cpp plain"]
        differing += any(o != ours[0] for o in ours)
        print(f"prompt {index + 1}/{len(prompts)} ({prompt.category}) done", flush=True)
    report = summary(totals, differing, len(prompts), args, peer_note)
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


def summary(totals: dict[str, dict[str, float]], differing: int, prompts: int, args: Any, peer: str) -> dict[str, Any]:
    rates = {
        name: {
            "decode_tok_s": t["decode_tokens"] / t["decode_s"] if t["decode_s"] else math.nan,
            "end_to_end_tok_s": t["tokens"] / t["total_s"] if t["total_s"] else math.nan,
            "tokens": t["tokens"],
            "cpu_s": t["total_s"],
        }
        for name, t in totals.items()
    }

    def ratio(a: str, b: str) -> float | None:
        return rates[a]["decode_tok_s"] / rates[b]["decode_tok_s"] if a in rates and b in rates else None

    return {
        "half": args.half,
        "prompts": prompts,
        "max_new_tokens": args.max_new_tokens,
        "peer": peer,
        "systems": rates,
        "blocks_plain_over_fp32_plain": ratio("blocks plain", "fp32 plain"),
        "blocks_ssp_over_blocks_plain": ratio("blocks SSp", "blocks plain"),
        "blocks_ssp_over_llama_cpp_plain": ratio("blocks SSp", "llama.cpp plain"),
        "our_outputs_differing": differing,
    }


if __name__ == "__main__":
    sys.exit(main())
