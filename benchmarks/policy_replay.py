"""Replay the speculative loop on recorded greedy outputs, to choose window policies without the model.

`record`: one greedy run per prompt of one half of the dev + more prompts (per category, even positions:
choose; odd: report), keeping the output and the target's probability of each token, each prompt's
prefill time, and the per-width call cost of the target through each forward (interleaved rounds).

`sweep`: the real SpeculativeGenerator (drafter, policy, acceptor, loop) over a ReplayTarget that answers
every call with the recorded tokens. That is exact for greedy decoding: the loop reads a row of a target
call only while every token before it was accepted, and such a row is the recorded one. Time is
estimated as the prompt's prefill + the cost of each call's width (the recorded curve smoothed as the
cost policy smooths it: call_cost.affine) + a host time per call, so
policies are ranked under one cost curve at a time (the packed compact forward's, or Hugging Face's as
before the cost policy); `neuron-ssp bench` then measures the chosen settings on the other half.

    python benchmarks/policy_replay.py record /tmp/choose.json --half choose --threads 1
    python benchmarks/policy_replay.py sweep /tmp/choose.json [--curve compact|hf|flat]
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable
from pathlib import Path

import torch
from drafter_replay import greedy_with_confidence

from neuron_ssp.backends.torch.scoring import TorchBackend
from neuron_ssp.config import load_config
from neuron_ssp.drafters.base import Draft, Drafter
from neuron_ssp.engines.base import sampling_params
from neuron_ssp.engines.native import SpeculativeGenerator
from neuron_ssp.pipeline.build import build_drafter
from neuron_ssp.speculation.acceptors import build_acceptor
from neuron_ssp.speculation.call_cost import WidthCost, affine, measure_width_cost
from neuron_ssp.speculation.cost_policy import AcceptanceModel, Cell
from neuron_ssp.speculation.policies import WindowPolicy, build_policy
from neuron_ssp.tools.leviathan import draft_length_counts
from neuron_ssp.tools.prompt_set import by_category, load_prompts

HERE = Path(__file__).resolve().parent
PROMPT_FILES = (HERE / "prompts_dev.jsonl", HERE / "prompts_more.jsonl")
WIDTHS = list(range(1, 17))
HOST_MS = 1.0  # loop time per call outside the target (drafting, acceptance, sampling): measured ~1 ms


def record(path: Path, half: str, max_new_tokens: int) -> None:
    from neuron_ssp.pipeline.load import load_pipeline

    pipeline = load_pipeline(load_config())
    model = pipeline.target.model
    curve_ids = pipeline.encode(" ".join(p.text for p in load_prompts(PROMPT_FILES[0])))[:170]
    curves = {
        name: measure_width_cost(TorchBackend(model, 2048, forward=forward), curve_ids, WIDTHS, 5).ms
        for name, forward in (("compact", "auto"), ("hf", "hf"))
    }
    rows = []
    grouped = by_category([p for f in PROMPT_FILES for p in load_prompts(f)], half=half)
    for position in range(max(len(g) for g in grouped.values())):
        for category, group in grouped.items():
            if position >= len(group):
                continue
            ids = pipeline.encode(group[position].text)
            begin = time.perf_counter()
            pipeline.target.prefill(ids)
            prefill_ms = 1000.0 * (time.perf_counter() - begin)
            tokens, confidence = greedy_with_confidence(pipeline, ids, max_new_tokens)
            rows.append(
                {
                    "category": category,
                    "prompt": ids.tolist(),
                    "output": tokens,
                    "confidence": confidence,
                    "prefill_ms": prefill_ms,
                }
            )
            print(category, position, len(tokens), flush=True)
    path.write_text(json.dumps({"curves": curves, "eos": sorted(pipeline.eos_token_ids), "rows": rows}))


class ReplayTarget:
    """A target that answers with the recorded greedy output: row i of a call at `start` predicts the
    recorded token at slot start+i+1, with the recorded probability (the rest spread evenly)."""

    max_score_width = None
    name = "replay"

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size
        self.n_positions = 1 << 20
        self.prompt_len = 0
        self.output: list[int] = []
        self.confidence: list[float] = []

    def load(self, prompt_len: int, output: list[int], confidence: list[float]) -> None:
        self.prompt_len, self.output, self.confidence = prompt_len, output, confidence

    def _row(self, slot: int) -> torch.Tensor:
        index = min(slot + 1 - self.prompt_len, len(self.output) - 1)
        p = min(max(self.confidence[index], 1e-6), 1 - 1e-6)
        row = torch.full((self.vocab_size,), math.log((1 - p) / (self.vocab_size - 1)))
        row[self.output[index]] = math.log(p)
        return row

    def prefill(self, prompt_ids: torch.Tensor) -> torch.Tensor:
        return self._row(prompt_ids.shape[0] - 1)

    def score(self, token_ids: torch.Tensor, start: int) -> torch.Tensor:
        return torch.stack([self._row(start + i) for i in range(token_ids.shape[0])])


def replay(
    data: dict,
    overrides: dict,
    curve: dict[int, float],
    policy_for: Callable[[ReplayTarget], WindowPolicy] | None = None,
) -> dict[str, list[float]]:
    """{category: [estimated plain ms, estimated SSp ms, tokens, drafted, accepted]} over the rows, in
    round-robin order (as bench runs them), one drafter for all of them. `policy_for`: a policy of one's own
    (it may read the recorded output off the target); else the config's."""
    config = load_config(overrides=overrides)
    cost = affine(WidthCost({int(w): ms for w, ms in curve.items()}), max(int(w) for w in curve))
    target = ReplayTarget(49152)
    rng = torch.Generator()
    acceptor = build_acceptor(config.speculation.acceptor, sampling_params(config.sampling), rng)
    drafter: Drafter = build_drafter(config, target, None, rng)
    spec = config.speculation
    policy = policy_for(target) if policy_for is not None else build_policy(spec, cost)
    loop = SpeculativeGenerator(target, drafter, acceptor, policy, config.sampling, spec.k, rng)
    per: dict[str, list[float]] = {}
    for row in data["rows"]:
        target.load(len(row["prompt"]), row["output"], row["confidence"])
        result = loop.generate(torch.tensor(row["prompt"]), len(row["output"]), data["eos"])
        assert result.tokens == row["output"], "greedy SSp must reproduce the recorded output"
        stats = result.stats
        lengths = draft_length_counts(stats)
        ssp_ms = row["prefill_ms"] + sum(n * (cost.at(m + 1) + HOST_MS) for m, n in lengths.items())
        plain_ms = row["prefill_ms"] + (len(row["output"]) - 1) * (cost.at(1) + HOST_MS)
        totals = per.setdefault(row["category"], [0.0] * 5)
        for i, value in enumerate((plain_ms, ssp_ms, len(row["output"]), stats.draft_tokens, stats.accepted_tokens)):
            totals[i] += value
    return per


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def report(name: str, per: dict[str, list[float]]) -> float:
    speedups = {c: t[0] / t[1] for c, t in per.items()}
    cells = " ".join(
        f"{c[:6]} {s:.3f}/{t[4] / t[3] if t[3] else 0:.2f}"
        for (c, s), t in zip(sorted(speedups.items()), [per[c] for c in sorted(per)], strict=True)
    )
    score = geomean(list(speedups.values()))
    print(f"{score:.3f} min {min(speedups.values()):.3f}  {name:48s} {cells}", flush=True)
    return score


SETTINGS: dict[str, dict] = {
    **{f"cost k{k}": {"speculation.policy": "cost", "speculation.k": k} for k in (8, 12, 16)},
    **{f"fixed k{k}": {"speculation.policy": "fixed", "speculation.k": k} for k in (8, 12, 16)},
    **{
        f"target-confidence {t} k8": {
            "speculation.policy": "target-confidence",
            "speculation.k": 8,
            "speculation.confidence_threshold": t,
        }
        for t in (0.0, 0.1, 0.2, 0.3, 0.4, 0.6)
    },
}
# prompt lookup's n-gram range under the cost policy (ngram drafter only): a 1-token match is weak
# evidence, worth checking only where a 2-wide call costs about what a 1-wide one does
NGRAM_SETTINGS: dict[str, dict] = {
    f"cost k16 ngram {low}..{high}": {
        "speculation.policy": "cost",
        "speculation.k": 16,
        "speculation.ngram_min": low,
        "speculation.ngram_max": high,
    }
    for low, high in ((1, 3), (1, 4), (2, 4), (3, 4))
}


def sweep(path: Path, curve_name: str, drafters: list[str]) -> None:
    """`flat`: every width priced as the compact forward's width-1 call, what a free wide call would give."""
    data = json.loads(path.read_text())
    compact = data["curves"]["compact"]
    curve = {w: compact["1"] for w in compact} if curve_name == "flat" else data["curves"][curve_name]
    print(f"curve {curve_name}: " + " ".join(f"{w}:{curve[str(w)] / curve['1']:.2f}" for w in (2, 4, 8, 12, 16)))
    for drafter in drafters:
        settings = {**SETTINGS, **NGRAM_SETTINGS} if drafter == "ngram" else SETTINGS
        for name, overrides in settings.items():
            report(f"{drafter} {name}", replay(data, {**overrides, "speculation.drafter": drafter}, curve))


class Recorder(WindowPolicy):
    """Scores every drafted token (window k) and counts the outcomes per evidence cell of the cost policy."""

    uses_target_confidence = True

    def __init__(self, k: int, model: AcceptanceModel):
        super().__init__(k)
        self.model = model
        self.cells: list[Cell] = []

    def keep(self, draft: Draft, target_confidence: float) -> int:
        self.cells = self.model.cells(target_confidence, draft.match_len, len(draft))
        return len(draft)

    def observe(self, drafted: int, accepted: int) -> None:
        if drafted:
            self.model.record(self.cells[:drafted], accepted)


def prior(path: Path, drafters: list[str], k: int = 16) -> None:
    """The acceptance rate per evidence cell when every drafted token is scored: the cost policy's prior."""
    data = json.loads(path.read_text())
    model = AcceptanceModel()
    recorder = Recorder(k, model)
    for drafter in drafters:
        replay(
            data, {"speculation.drafter": drafter, "speculation.k": k}, data["curves"]["compact"], lambda _: recorder
        )
    print("cell (position, confidence, match): accepted / judged = rate")
    for cell in sorted(model.judged):
        judged = model.judged[cell]
        print(f"{cell}: {model.accepted[cell]:.0f} / {judged:.0f} = {model.accepted[cell] / judged:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=("record", "sweep", "prior"))
    parser.add_argument("path", type=Path)
    parser.add_argument("--half", choices=("choose", "report"), default="choose")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--curve", choices=("compact", "hf", "flat"), default="compact")
    parser.add_argument("--drafters", default="ngram,suffix")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.mode == "record":
        record(args.path, args.half, args.max_new_tokens)
    elif args.mode == "prior":
        prior(args.path, args.drafters.split(","))
    else:
        sweep(args.path, args.curve, args.drafters.split(","))


if __name__ == "__main__":
    main()
