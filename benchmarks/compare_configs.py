"""Side by side: plain decoding and several speculation settings on the same prompts, in one run.

Per prompt, plain decoding and every variant run once, back to back, in an order that rotates from
prompt to prompt; speedups are per category (ratios of sums). Greedy outputs must all equal plain.
This is how `configs/default.yaml`'s speculation settings were chosen (docs/benchmarks.md).
Run: python benchmarks/compare_configs.py [--nb-prompts 24] [--threads 1]
"""

from __future__ import annotations

import argparse

import torch

from neuron_ssp.config import load_config
from neuron_ssp.engines.native import plain_generate
from neuron_ssp.pipeline.load import load_pipeline
from neuron_ssp.speculation.stats import merge_stats, throughput_ratio
from neuron_ssp.tools.per_k import generator_for_config
from neuron_ssp.tools.prompt_set import balanced, load_prompts

VARIANTS = {  # name -> speculation settings over the default config
    "k4 fixed ngram1-3": {"k": 4, "policy": "fixed", "ngram_min": 1},
    "k8 fixed ngram2-3": {"k": 8, "policy": "fixed", "ngram_min": 2},
    "k8 adaptive ngram2-3": {"k": 8, "policy": "adaptive", "ngram_min": 2},
    "k8 target-conf.4 ngram1-3": {"k": 8, "policy": "target-confidence", "confidence_threshold": 0.4, "ngram_min": 1},
    "k4 target-conf.4 ngram2-3": {"k": 4, "policy": "target-confidence", "confidence_threshold": 0.4, "ngram_min": 2},
    "k8 target-conf.4 ngram2-3": {"k": 8, "policy": "target-confidence", "confidence_threshold": 0.4, "ngram_min": 2},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nb-prompts", type=int, default=24)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    pipeline = load_pipeline(load_config(overrides={"sampling.temperature": 0.0}))
    base = pipeline.config
    generators = {
        name: generator_for_config(
            pipeline, base.model_copy(update={"speculation": base.speculation.model_copy(update=spec)})
        )
        for name, spec in VARIANTS.items()
    }
    prompts = balanced(load_prompts(), args.nb_prompts)
    eos = pipeline.eos_token_ids
    warm = pipeline.encode(prompts[0].text)
    plain_generate(pipeline.target, warm, 8, base.sampling, eos)
    for generator in generators.values():
        generator.generate(warm, 8, eos)
    runs: dict[str, dict[str, list]] = {}
    for turn, prompt in enumerate(prompts):
        ids = pipeline.encode(prompt.text)
        names = ["plain", *generators]
        names = names[turn % len(names) :] + names[: turn % len(names)]
        out = {
            name: plain_generate(pipeline.target, ids, args.max_new_tokens, base.sampling, eos)
            if name == "plain"
            else generators[name].generate(ids, args.max_new_tokens, eos)
            for name in names
        }
        assert all(out[name].tokens == out["plain"].tokens for name in generators), "greedy output differs"
        for name, result in out.items():
            runs.setdefault(prompt.category, {}).setdefault(name, []).append(result.stats)
    print(f"{'speedup (α)':<16}" + "".join(f"{name:>28}" for name in generators))
    lowest = dict.fromkeys(generators, float("inf"))
    for category, by_name in runs.items():
        plain = merge_stats(by_name["plain"])
        cells = []
        for name in generators:
            ssp = merge_stats(by_name[name])
            speedup = throughput_ratio(ssp, plain)
            lowest[name] = min(lowest[name], speedup)
            cells.append(f"{speedup:.2f}x ({ssp.acceptance_rate:.2f})")
        print(f"{category:<16}" + "".join(f"{cell:>28}" for cell in cells))
    print(f"{'lowest':<16}" + "".join(f"{lowest[name]:>27.2f}x" for name in generators))


if __name__ == "__main__":
    main()
