"""Does a backend's k-wide scoring call agree with one-token calls at the same cache positions?

A speculative loop trusts the target's k-wide window (transformers-neuronx `speculative_forward`, NxD
Inference's speculation model, ...) to give the logits that k one-token calls at the same positions
would. A build that gets the window's cache positions wrong produces fluent garbage with no error.
Nothing here knows a library: `judge_windows` takes the one-token logits and the k-wide logits of the
same positions, whatever produced them; `score_both_ways` produces both through the `ModelBackend`
contract; `passage_ids` gives the text to score.

How it judges (the thresholds and their basis):
- Natural text, not arbitrary ids: a real model is confident on it, and confident predictions are
  what a wrong cache breaks (the Gettysburg Address, public domain).
- The positions are split at `edge`, the first cache position a suspected bug touches (for
  transformers-neuronx 0623de2: the smallest context bucket, slot 64), and each side is judged on its
  own, so a broken region is not averaged away by a healthy one. The region from the edge should
  hold at least MIN_PAST_EDGE positions (a shorter one is reported, not failed).
- Per position: KL(one-token || window) of the two softmaxes in nats, max |logit difference| over
  the logits' standard deviation, and whether the argmax agrees.
- A region fails when its argmax agreement is below `min_agreement`, its mean KL is above
  MAX_MEAN_KL, or its agreement is more than MAX_AGREEMENT_DROP below the region before it.
  Measured with the embedded SmolLM2-135M on this passage (CPU, fp32): the whole model in bf16
  against fp32, a far larger difference than two bf16 graphs of one build, gives mean KL 0.0015 and
  max 0.0086 nats, argmax agreement 96 %; transformers-neuronx 0623de2's capped cache_ids (stand-in)
  give mean KL 6.1 to 7.5 nats and agreement 4 to 10 % from slot 64 at k = 2, 5 and 8. MAX_MEAN_KL
  0.25 sits 160x above that noise and 24x below the capping.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from neuron_ssp.backends.base import ModelBackend

MAX_MEAN_KL = 0.25  # nats, per region (see the module docstring for the basis)
MAX_AGREEMENT_DROP = 0.10  # the region from the edge may agree at most 10 points less than the one before
MIN_PAST_EDGE = 32  # positions judged from the edge on

PASSAGE = (
    "Four score and seven years ago our fathers brought forth on this continent, a new nation, conceived "
    "in Liberty, and dedicated to the proposition that all men are created equal. Now we are engaged in a "
    "great civil war, testing whether that nation, or any nation so conceived and so dedicated, can long "
    "endure. We are met on a great battle-field of that war. We have come to dedicate a portion of that "
    "field, as a final resting place for those who here gave their lives that that nation might live. It "
    "is altogether fitting and proper that we should do this. But, in a larger sense, we can not "
    "dedicate, we can not consecrate, we can not hallow this ground. The brave men, living and dead, who "
    "struggled here, have consecrated it, far above our poor power to add or detract. The world will "
    "little note, nor long remember what we say here, but it can never forget what they did here. It is "
    "for us the living, rather, to be dedicated here to the unfinished work which they who fought here "
    "have thus far so nobly advanced. It is rather for us to be here dedicated to the great task "
    "remaining before us, that from these honored dead we take increased devotion to that cause for "
    "which they gave the last full measure of devotion, that we here highly resolve that these dead "
    "shall not have died in vain, that this nation, under God, shall have a new birth of freedom, and "
    "that government of the people, by the people, for the people, shall not perish from the earth."
)


def passage_ids(tokenizer: Any, length: int) -> torch.Tensor:
    """`length` token ids of the passage (repeated if a tokenizer makes it shorter)."""
    ids = list(tokenizer(PASSAGE)["input_ids"])
    while len(ids) < length:
        ids += ids
    return torch.tensor(ids[:length], dtype=torch.long)


@dataclass(frozen=True)
class WindowScores:
    """Logits of the same cache positions, scored one token per call and k tokens per call."""

    positions: list[int]
    one_token: torch.Tensor  # (n, vocab)
    windowed: torch.Tensor  # (n, vocab)


@torch.inference_mode()
def score_both_ways(backend: ModelBackend, tokens: torch.Tensor, k: int, prompt_len: int) -> WindowScores:
    """Prefill `prompt_len` tokens, then score the rest window by window: once as one k-wide call, once as
    k one-token calls at the same positions. Both write the same tokens to the same slots, so whichever
    runs second reads exactly the cache the first one left."""
    backend.prefill(tokens[:prompt_len])
    positions: list[int] = []
    windowed, one_token = [], []
    for start in range(prompt_len, len(tokens) - k + 1, k):
        windowed.append(backend.score(tokens[start : start + k], start))
        one_token += [backend.score(tokens[i : i + 1], i) for i in range(start, start + k)]
        positions += range(start, start + k)
    if not positions:
        empty = torch.empty(0, 0)
        return WindowScores([], empty, empty)
    return WindowScores(positions, torch.cat(one_token).float(), torch.cat(windowed).float())


@dataclass(frozen=True)
class PositionCheck:
    position: int  # cache slot
    kl: float  # KL(one-token || window) of the softmaxes, nats
    relative_diff: float  # max |window logit - one-token logit| / std of the one-token logits
    argmax_agrees: bool


@dataclass(frozen=True)
class RegionCheck:
    name: str
    positions: int
    argmax_agreement: float | None  # None: no position in this region
    mean_kl: float | None
    max_relative_diff: float | None


@dataclass(frozen=True)
class WindowJudgement:
    """The verdict on one backend's k-wide window: per position, per region, and why it failed."""

    k: int
    edge: int
    min_agreement: float
    rows: list[PositionCheck]
    failures: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures

    @property
    def before(self) -> RegionCheck:
        return _region(f"before slot {self.edge}", [r for r in self.rows if r.position < self.edge])

    @property
    def past(self) -> RegionCheck:
        return _region(f"from slot {self.edge}", [r for r in self.rows if r.position >= self.edge])

    @property
    def short_of_edge(self) -> int:
        """Positions from the edge on that the cache had no room for (0: the full MIN_PAST_EDGE judged)."""
        return max(MIN_PAST_EDGE - self.past.positions, 0)

    @property
    def exact(self) -> bool:
        return all(r.argmax_agrees and r.relative_diff == 0.0 for r in self.rows)

    def summary(self) -> str:
        return "; ".join(_describe(region) for region in (self.before, self.past))

    def to_dict(self) -> dict[str, Any]:
        thresholds = {
            "min_agreement": self.min_agreement,
            "max_mean_kl": MAX_MEAN_KL,
            "max_agreement_drop": MAX_AGREEMENT_DROP,
            "min_past_edge": MIN_PAST_EDGE,
        }
        return {
            **{name: getattr(self, name) for name in ("k", "edge", "passed", "failures")},
            "thresholds": thresholds,
            "regions": [region.__dict__ for region in (self.before, self.past)],
            "positions": [row.__dict__ for row in self.rows],
        }


def judge_windows(scores: WindowScores, k: int, edge: int, min_agreement: float) -> WindowJudgement:
    """Per-position distances, then each region on its own and the region from `edge` against the one before."""
    rows = _position_checks(scores)
    judgement = WindowJudgement(k, edge, min_agreement, rows)
    before, past = judgement.before, judgement.past
    failures = []
    for region in (before, past):
        if region.argmax_agreement is None or region.mean_kl is None:
            continue
        if region.argmax_agreement < min_agreement:
            failures.append(f"{region.name}: argmax agreement {region.argmax_agreement:.0%} < {min_agreement:.0%}")
        if region.mean_kl > MAX_MEAN_KL:
            failures.append(f"{region.name}: mean KL {region.mean_kl:.3g} nats > {MAX_MEAN_KL}")
    if before.argmax_agreement is not None and past.argmax_agreement is not None:
        drop = before.argmax_agreement - past.argmax_agreement
        if drop > MAX_AGREEMENT_DROP:
            failures.append(
                f"{past.name}: argmax agreement {drop:.0%} below the {before.argmax_agreement:.0%} "
                f"{before.name} (at most {MAX_AGREEMENT_DROP:.0%} allowed)"
            )
    return WindowJudgement(k, edge, min_agreement, rows, failures)


def _position_checks(scores: WindowScores) -> list[PositionCheck]:
    if not scores.positions:
        return []
    p_log = scores.one_token.log_softmax(-1)
    q_log = scores.windowed.log_softmax(-1)
    kl = (p_log.exp() * (p_log - q_log)).sum(-1).clamp(min=0.0)
    spread = scores.one_token.std(-1).clamp(min=torch.finfo(torch.float32).tiny)
    relative = (scores.windowed - scores.one_token).abs().amax(-1) / spread
    agrees = scores.one_token.argmax(-1) == scores.windowed.argmax(-1)
    return [PositionCheck(p, float(kl[i]), float(relative[i]), bool(agrees[i])) for i, p in enumerate(scores.positions)]


def _region(name: str, rows: Sequence[PositionCheck]) -> RegionCheck:
    if not rows:
        return RegionCheck(name, 0, None, None, None)
    return RegionCheck(
        name,
        len(rows),
        sum(r.argmax_agrees for r in rows) / len(rows),
        sum(r.kl for r in rows) / len(rows),
        max(r.relative_diff for r in rows),
    )


def _describe(region: RegionCheck) -> str:
    if region.argmax_agreement is None:
        return f"{region.name}: not reached"
    return (
        f"{region.name}: {region.positions} positions, argmax agreement {region.argmax_agreement:.0%}, "
        f"mean KL {region.mean_kl:.3g} nats, max |logit diff| {region.max_relative_diff:.3g} x the logits' std"
    )
