"""Replay model-free drafters on recorded greedy outputs: acceptance and an estimated speedup, in seconds.

Greedy SSp commits exactly the plain greedy output, so once the target's output and its confidence
in each token are recorded (`record`, one model run per prompt), any model-free drafter
configuration can be replayed without the model (`sweep`): per step the policy picks the window,
the drafter proposes, the recorded output says how many drafted tokens the target accepts.
The time estimate charges 1 for a one-token target call and `call_cost(w)` for a w-wide one (the
ratios measured on this 2-core CPU, docs/benchmarks.md), so it ranks configurations; `neuron-ssp
bench` then measures the chosen one.

The prompt set is split per category into a choose half (even positions) and a report half (odd).

    python benchmarks/drafter_replay.py record /tmp/replay.json --threads 1
    python benchmarks/drafter_replay.py sweep /tmp/replay.json --half choose
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
from pathlib import Path

import torch

from neuron_ssp.config import SuffixConfig
from neuron_ssp.drafters import NgramDrafter, SuffixDrafter
from neuron_ssp.tools.prompt_set import DEFAULT_PROMPTS, by_category, load_prompts


def call_cost(width: int) -> float:
    """Target call time / one-token call time on this CPU: ~1.6x at width 2, ~1.8x at width 8."""
    return 1.0 if width == 1 else 1.6 + 0.2 * min(width - 2, 6) / 6


def record(path: Path, max_new_tokens: int, half: str) -> None:
    from neuron_ssp.config import load_config
    from neuron_ssp.pipeline.load import load_pipeline

    pipeline = load_pipeline(load_config())
    rows = []
    todo = [
        (category, position, prompt)
        for category, prompts in by_category(load_prompts(DEFAULT_PROMPTS)).items()
        for position, prompt in enumerate(prompts)
        if _in_half(position, half)
    ]
    todo.sort(key=lambda item: item[1] % 2)  # the choose half first
    for category, position, prompt in todo:
        ids = pipeline.encode(prompt.text)
        tokens, confidence = greedy_with_confidence(pipeline, ids, max_new_tokens)
        rows.append(
            {
                "category": category,
                "position": position,
                "prompt": ids.tolist(),
                "output": tokens,
                "confidence": confidence,
            }
        )
        print(category, position, len(tokens), flush=True)
        path.write_text(json.dumps(rows))


def _in_half(position: int, half: str) -> bool:
    return half == "all" or (position % 2 == 0) == (half == "choose")


def greedy_with_confidence(pipeline, ids: torch.Tensor, max_new_tokens: int) -> tuple[list[int], list[float]]:
    """The target's greedy output and its probability for each token it chose."""
    target = pipeline.target
    logits = target.prefill(ids)
    tokens: list[int] = []
    confidence: list[float] = []
    while True:
        probs = logits.float().softmax(-1)
        token = int(probs.argmax())
        tokens.append(token)
        confidence.append(float(probs[token]))
        if token in pipeline.eos_token_ids or len(tokens) == max_new_tokens:
            return tokens, confidence
        logits = target.score(torch.tensor([token]), ids.shape[0] + len(tokens) - 1)[0]


def replay(rows: list[dict], make_drafter, k: int, threshold: float) -> dict[str, dict[str, float]]:
    """Rows in round-robin order across categories (as bench runs them), one drafter for all of them."""
    drafter = make_drafter()
    per: dict[str, list[float]] = {}
    for row in _round_robin(rows):
        prompt, output, conf = row["prompt"], row["output"], row["confidence"]
        committed = list(prompt) + [output[0]]
        drafter.begin(torch.tensor(prompt), len(output))
        cost, drafted, accepted = 0.0, 0, 0
        i = 1  # output tokens committed (the first comes from the prefill)
        while i < len(output):
            window = min(k if conf[i - 1] >= threshold else 1, k, len(output) - i)
            draft = drafter.propose(torch.tensor(committed), window - 1) if window > 1 else None
            proposal = draft.tokens.tolist() if draft is not None else []
            good = 0
            while good < len(proposal) and i + good < len(output) and proposal[good] == output[i + good]:
                good += 1
            step = min(good + 1, len(output) - i)
            committed += output[i : i + step]
            i += step
            cost += call_cost(1 + len(proposal))
            drafted += len(proposal)
            accepted += good
        drafter.finish(torch.tensor(committed))
        stats = per.setdefault(row["category"], [0.0, 0.0, 0.0, 0.0, 0.0])
        stats[0] += len(output) - 1
        stats[1] += cost
        stats[2] += drafted
        stats[3] += accepted
        stats[4] += 1
    return {c: {"speedup": s[0] / s[1] if s[1] else 1.0, "alpha": s[3] / s[2] if s[2] else 0.0} for c, s in per.items()}


def _round_robin(rows: list[dict]) -> list[dict]:
    groups: dict[str, list[dict]] = {}
    for row in rows:
        groups.setdefault(row["category"], []).append(row)
    longest = max(len(g) for g in groups.values())
    return [g[i] for i in range(longest) for g in groups.values() if i < len(g)]


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def sweep(path: Path, half: str, vocab: int) -> None:
    """Every configuration on one half; ranked first by the categories where it is at least prompt lookup's
    estimate (the suffix drafter must never draft worse than prompt lookup it extends), then by the geomean."""
    rows = json.loads(path.read_text())
    rows = [r for r in rows if _in_half(r["position"], half)]
    configs: list[tuple[str, object, int, float]] = []
    for k, threshold in itertools.product((8,), (0.4,)):
        configs.append((f"ngram 2..3 k={k} tc={threshold}", lambda: NgramDrafter(vocab, 3, 2), k, threshold))
        for prob, factor, nmin, history in itertools.product(
            (0.0, 0.1, 0.2, 0.5), (2.0, 4.0), (2, 3), (2, 3, 4, 5, 6, 8)
        ):
            settings = SuffixConfig(
                max_depth=24, min_token_prob=prob, max_spec_factor=factor, min_match=nmin, min_history_match=history
            )
            configs.append(
                (
                    f"suffix p={prob} f={factor} m={nmin} h={history} k={k} tc={threshold}",
                    lambda s=settings: SuffixDrafter(vocab, s),
                    k,
                    threshold,
                )
            )
    results = []
    for name, make, k, threshold in configs:
        per = replay(rows, make, k, threshold)
        results.append((geomean([v["speedup"] for v in per.values()]), name, per))
    baseline = results[0][2]
    wins = {name: sum(per[c]["speedup"] >= baseline[c]["speedup"] - 1e-9 for c in per) for _, name, per in results}
    results.sort(key=lambda r: (-wins[r[1]], -r[0]))
    print(f"{results[0][0]:.3f}  w{wins[results[0][1]]}  (first: the best; ngram is the baseline of the w column)")
    for score, name, per in results[:25] + [r for r in results if r[1].startswith("ngram")]:
        cells = " ".join(f"{c[:6]} {v['speedup']:.3f}/{v['alpha']:.2f}" for c, v in sorted(per.items()))
        print(f"{score:.3f}  w{wins[name]}  {name:45s} {cells}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=("record", "sweep"))
    parser.add_argument("path", type=Path)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--half", choices=("choose", "report", "all"), default="choose")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--vocab", type=int, default=49152)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.mode == "record":
        record(args.path, args.max_new_tokens, args.half)
    else:
        sweep(args.path, args.half, args.vocab)


if __name__ == "__main__":
    main()
