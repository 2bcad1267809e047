"""Loop overhead (wall time outside model calls) of speculative sampling on the embedded default.

Target: <= 10 % of wall time at 128 new tokens. Prints one row per prompt and the mean, so the
figure is measured, not asserted by a timed unit test.
Run: python benchmarks/loop_overhead.py [--nb-prompts 6]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from neuron_ssp.config import load_config
from neuron_ssp.pipeline.load import load_pipeline

PROMPTS = Path(__file__).parent / "prompts_dev.jsonl"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nb-prompts", type=int, default=6)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    args = parser.parse_args()
    rows = [json.loads(line) for line in PROMPTS.read_text().splitlines() if line.strip()]
    picked = [rows[i * len(rows) // args.nb_prompts] for i in range(args.nb_prompts)]  # spread over categories
    pipeline = load_pipeline(load_config(overrides={"generation.max_new_tokens": args.max_new_tokens}))
    pipeline.speculative(picked[0]["prompt"], max_new_tokens=8)  # warm-up
    shares = []
    print(f"{'category':<16}{'tokens':>7}{'wall s':>8}{'draft s':>9}{'target s':>9}{'overhead s':>11}{'share':>8}")
    for row in picked:
        stats = pipeline.speculative(row["prompt"]).result.stats
        share = stats.time_overhead_s / stats.wall_s
        shares.append(share)
        print(
            f"{row['category']:<16}{stats.new_tokens:>7}{stats.wall_s:>8.2f}{stats.time_draft_s:>9.3f}"
            f"{stats.time_target_s:>9.2f}{stats.time_overhead_s:>11.3f}{share:>8.1%}"
        )
    print(f"mean loop overhead: {sum(shares) / len(shares):.1%} of wall time (target <= 10%)")


if __name__ == "__main__":
    main()
