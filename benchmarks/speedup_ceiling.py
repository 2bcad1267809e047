"""How far SSp with prompt lookup can go on this machine, whatever the window policy or the verification.

On recorded greedy outputs (`policy_replay.py record`) and the same time model as `policy_replay.py sweep`
(prefill + the smoothed cost of each call's width + a host time per call), it estimates, per category and
as the geomean over categories:

- `default`: the shipped settings (ngram 1..4, cost policy, k 16);
- `oracle window`: the same proposals, each cut to exactly the tokens the target will accept (a policy
  that knew every outcome in advance): the most any window policy can get from these drafts;
- `flat curve`: the default with every width priced as one token (a k-wide call that costs what a one-wide
  call does, as on Neuron up to the compiled k): the most any cheaper wide call can give;
- `chain L` / `two branches L+M`: fixed-length drafts from the latest match, alone or verified together
  with a second branch of M tokens from the latest match that continues differently (tree verification,
  both branches scored in one call of width 1+L+M; the longer accepted branch wins).

    python benchmarks/speedup_ceiling.py /tmp/choose.json
"""

from __future__ import annotations

import argparse
import json
from functools import partial
from pathlib import Path

import torch
from policy_replay import HOST_MS, ReplayTarget, geomean, replay

from neuron_ssp.drafters.ngram import overlapping_copy
from neuron_ssp.speculation.call_cost import WidthCost, affine
from neuron_ssp.speculation.cost_policy import Proposal
from neuron_ssp.speculation.policies import WindowPolicy

DEFAULT = {
    "speculation.drafter": "ngram",
    "speculation.policy": "cost",
    "speculation.k": 16,
    "speculation.ngram_min": 1,
    "speculation.ngram_max": 4,
}
LENGTHS = (3, 5, 7, 9, 11, 15)
SECOND = (0, 1, 2, 4)


class OracleWindow(WindowPolicy):
    """Keeps exactly the drafted tokens that the recorded output confirms."""

    def __init__(self, k: int, target: ReplayTarget):
        super().__init__(k)
        self.target = target
        self.committed = 1

    def reset(self) -> None:
        self.committed = 1  # the prefill's token

    def keep(self, draft: Proposal, target_confidence: float) -> int:
        truth = self.target.output[self.committed : self.committed + len(draft)]
        return common_prefix(draft.tokens.tolist(), truth)  # type: ignore[attr-defined]

    def observe(self, drafted: int, accepted: int) -> None:
        self.committed += accepted + 1


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def continuations(sequence: list[int], count: int, ngram_max: int = 4) -> list[int]:
    """Where the copies start: the latest match of the longest matching n-gram (prompt lookup's own
    choice), then later-to-earlier matches of the same n whose next token differs from those taken."""
    length = len(sequence)
    for n in range(min(ngram_max, length - 1), 0, -1):
        tail, starts, firsts = sequence[length - n :], [], set()
        for i in range(length - n - 1, -1, -1):
            if sequence[i : i + n] == tail and sequence[i + n] not in firsts:
                firsts.add(sequence[i + n])
                starts.append(i + n)
                if len(starts) == count:
                    break
        if starts:
            return starts
    return []


def fixed_branches(data: dict, cost: WidthCost, first: int, second: int) -> dict[str, float]:
    """Speedup per category with `first` drafted tokens from the latest match and, where a second
    continuation exists, `second` more from it, scored together."""
    per: dict[str, list[float]] = {}
    for row in data["rows"]:
        prompt, output = row["prompt"], row["output"]
        done, ssp_ms = 1, row["prefill_ms"]
        while done < len(output):
            sequence = prompt + output[:done]
            truth = output[done:]
            starts = continuations(sequence, 2 if second else 1)
            accepted, width = 0, 1
            for start, m in zip(starts, (first, second), strict=False):
                branch = overlapping_copy(torch.tensor(sequence), start, m).tolist()
                accepted = max(accepted, common_prefix(branch, truth))
                width += m
            ssp_ms += cost.at(width) + HOST_MS
            done += accepted + 1
        plain_ms = row["prefill_ms"] + (len(output) - 1) * (cost.at(1) + HOST_MS)
        totals = per.setdefault(row["category"], [0.0, 0.0])
        totals[0] += plain_ms
        totals[1] += ssp_ms
    return {category: plain / ssp for category, (plain, ssp) in per.items()}


def speedups(per: dict[str, list[float]]) -> dict[str, float]:
    return {category: totals[0] / totals[1] for category, totals in per.items()}


def line(name: str, by_category: dict[str, float]) -> None:
    cells = " ".join(f"{c[:6]} {s:.3f}" for c, s in sorted(by_category.items()))
    print(f"{geomean(list(by_category.values())):.3f}  {name:28s} {cells}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("path", type=Path, help="a recording of policy_replay.py record")
    args = parser.parse_args()
    data = json.loads(args.path.read_text())
    curve = data["curves"]["compact"]
    flat = {w: curve["1"] for w in curve}
    cost = affine(WidthCost({int(w): ms for w, ms in curve.items()}), max(int(w) for w in curve))
    print("curve compact: " + " ".join(f"{w}:{curve[str(w)] / curve['1']:.2f}" for w in (2, 4, 8, 12, 16)))
    oracle = partial(OracleWindow, DEFAULT["speculation.k"])
    line("default", speedups(replay(data, DEFAULT, curve)))
    line("oracle window", speedups(replay(data, DEFAULT, curve, oracle)))
    line("flat curve", speedups(replay(data, DEFAULT, flat)))
    line("oracle window, flat curve", speedups(replay(data, DEFAULT, flat, oracle)))
    for first in LENGTHS:
        for second in SECOND:
            name = f"chain {first}" if not second else f"two branches {first}+{second}"
            line(name, fixed_branches(data, cost, first, second))


if __name__ == "__main__":
    main()
