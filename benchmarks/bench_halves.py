"""Re-aggregate a `bench --drafter A,B --json` run per half of the prompt set: choose on one, report the other.

Within each category the prompts at even positions form the choose half, the odd ones the report
half (positions in the order of the prompt file). Speedup = drafter tokens/s ÷ plain tokens/s over
the same prompts of the same run (ratios of sums, as bench reports them); α = accepted ÷ drafted;
accepted length = tokens committed per decoding-loop target call.

    neuron-ssp bench --threads 1 --drafter ngram,suffix --json > run.json
    python benchmarks/bench_halves.py run.json
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

HALVES = {"choose": 0, "report": 1}


def aggregate(rows: list[dict], drafter: str) -> dict[str, float]:
    plain_tokens = sum(r["plain"]["new_tokens"] for r in rows)
    plain_wall = sum(r["plain"]["wall_s"] for r in rows)
    runs = [r["drafters"][drafter] for r in rows]
    tokens, wall = sum(x["new_tokens"] for x in runs), sum(x["wall_s"] for x in runs)
    drafted, accepted = sum(x["draft_tokens"] for x in runs), sum(x["accepted_tokens"] for x in runs)
    calls, loop_tokens = sum(x["target_calls"] for x in runs), sum(x["loop_tokens"] for x in runs)
    return {
        "plain_tok_s": plain_tokens / plain_wall,
        "speedup": (tokens / wall) / (plain_tokens / plain_wall),
        "alpha": accepted / drafted if drafted else 0.0,
        "accepted_len": loop_tokens / calls if calls else 0.0,
        "equal": sum(x["outputs_equal"] for x in runs),
        "runs": len(runs),
    }


def table(rows: list[dict], drafters: list[str], title: str) -> None:
    categories = list(dict.fromkeys(r["category"] for r in rows))
    print(f"\n{title}")
    header = (
        f"{'category':>15} {'plain tok/s':>11} "
        + " ".join(f"{d + ' x':>9} {d + ' α':>9} {d + ' len':>9}" for d in drafters)
        + "  = plain"
    )
    print(header)
    speedups: dict[str, list[float]] = {d: [] for d in drafters}
    for category in [*categories, "all"]:
        subset = [r for r in rows if category in ("all", r["category"])]
        cells = [f"{category:>15}", f"{aggregate(subset, drafters[0])['plain_tok_s']:>11.1f}"]
        equal = []
        for d in drafters:
            a = aggregate(subset, d)
            cells.append(f"{a['speedup']:>8.2f}x {a['alpha']:>9.3f} {a['accepted_len']:>9.2f}")
            equal.append(f"{a['equal']}/{a['runs']}")
            if category != "all":
                speedups[d].append(a["speedup"])
        print(" ".join(cells) + "  " + " ".join(equal))
    print(
        f"{'geomean':>15} {'':>11} "
        + " ".join(f"{math.exp(sum(map(math.log, v)) / len(v)):>8.2f}x {'':>9} {'':>9}" for v in speedups.values())
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("path", type=Path)
    args = parser.parse_args()
    data = json.loads(args.path.read_text())
    rows, drafters = data["per_prompt"], list(data["drafters"])
    table(rows, drafters, "all prompts")
    for half, parity in HALVES.items():
        subset = [r for r in rows if r["position"] % 2 == parity]
        table(subset, drafters, f"{half} half (positions {parity}, {parity + 2} of each category)")


if __name__ == "__main__":
    main()
