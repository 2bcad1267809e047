"""Held-out acceptance of a draft head: per-step top-1 accuracy, and tau walked through greedy answers.

tau is Spec-Bench's mean accepted length (committed tokens / target calls, bonus included; DESIGN.md Metrics),
simulated on held-out greedy answers (the data's tokens are the target's argmax there): from each committed
position the head drafts a chain of up to k-1 tokens (step i of the training-time test at that position, whose
inputs are exactly the drafted tokens while they are accepted), the leading drafts equal to the target's argmax
are accepted, and the walk moves past them and the bonus token. Prompt lookup (drafters/ngram.py) walks the same
answers with the same k, so the two compare on one text. Decode calls only: the prefill's first token is not
counted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from neuron_ssp.drafters.eagle_head import EagleHead
from neuron_ssp.drafters.ngram import lookup_match
from neuron_ssp.tools.train_draft import Batch, training_time_test


@dataclass
class Evaluation:
    accuracy: list[float]  # per step: top-1 drafts equal to the target's argmax / answer positions (SafeAILab acc)
    conditional: list[float]  # per step on greedy answers: P(step i right | steps before it right)
    tau: dict[int, float] = field(default_factory=dict)  # window k -> tau of the head (greedy answers)
    ngram_tau: dict[int, float] = field(default_factory=dict)  # window k -> tau of prompt lookup, same answers
    tokens: int = 0  # held-out tokens evaluated
    greedy_answers: int = 0

    def to_dict(self) -> dict[str, object]:
        return {
            "accuracy": [round(x, 4) for x in self.accuracy],
            "conditional": [round(x, 4) for x in self.conditional],
            "tau": {str(k): round(v, 4) for k, v in self.tau.items()},
            "ngram_tau": {str(k): round(v, 4) for k, v in self.ngram_tau.items()},
            "tokens": self.tokens,
            "greedy_answers": self.greedy_answers,
        }


def leading_run(chain_ok: torch.Tensor) -> torch.Tensor:
    """(steps, T) bool -> (T,) the number of leading True steps at each position."""
    return chain_ok.int().cumprod(0).sum(0)


def walk(accepted_at: list[int], answer_start: int, length: int, window: int) -> tuple[int, int]:
    """(committed tokens, calls) of greedy speculation over one answer: at committed position c the chain drafted
    from p = c - 1 has `accepted_at[p]` right drafts; a call commits min(that, window - 1) + 1 tokens."""
    committed = calls = 0
    c = answer_start
    while c < length - 1:
        accepted = min(accepted_at[c - 1], window - 1, length - 2 - c)
        committed += accepted + 1
        calls += 1
        c += accepted + 1
    return committed, calls


def ngram_accepted(ids: torch.Tensor, c: int, window: int, ngram_max: int = 4, ngram_min: int = 1) -> int:
    """Prompt lookup's right drafts at committed position c (the default config's n-grams 1..4)."""
    proposal, _ = lookup_match(ids[: c + 1], window - 1, ngram_max, ngram_min)
    truth = ids[c + 1 : c + 1 + proposal.shape[0]]
    same = (proposal[: truth.shape[0]] == truth).int().cumprod(0)
    return int(same.sum())


def ngram_walk(ids: torch.Tensor, answer_start: int, window: int) -> tuple[int, int]:
    committed = calls = 0
    c = answer_start
    length = ids.shape[0]
    while c < length - 1:
        accepted = min(ngram_accepted(ids, c, window), length - 2 - c)
        committed += accepted + 1
        calls += 1
        c += accepted + 1
    return committed, calls


@torch.no_grad()
def evaluate(head: EagleHead, batches: list[Batch], steps: int, windows: tuple[int, ...]) -> Evaluation:
    """Accuracy per step over every held-out answer; chains and tau over the greedy ones."""
    in_draft = torch.zeros(head.config.vocab_size, dtype=torch.bool)
    in_draft[head.target_ids] = True
    correct, counted = [0] * steps, [0] * steps
    reached, right = [0] * steps, [0] * steps
    head_calls = {k: [0, 0] for k in windows}
    ngram_calls = {k: [0, 0] for k in windows}
    tokens = greedy_answers = 0
    for batch in batches:
        result = training_time_test(head, batch, steps, in_draft)
        tokens += batch.tokens
        for i in range(steps):
            correct[i] += result.correct[i]
            counted[i] += result.counted[i]
        for row in range(batch.ids.shape[0]):
            if not bool(batch.greedy[row]):
                continue
            greedy_answers += 1
            length, start = int(batch.lengths[row]), int(batch.answer_start[row])
            ids = batch.ids[row, :length]
            # the data's next token must be the target's argmax for a chain fed with it to be the drafter's chain
            agrees = torch.zeros(batch.ids.shape[1], dtype=torch.bool)
            agrees[: length - 1] = ids[1:] == batch.target_argmax[row, : length - 1]
            ok = result.chain_ok[:, row].clone()
            for i in range(1, steps):
                ok[i, : batch.ids.shape[1] - i] &= agrees[i : i + batch.ids.shape[1] - i]
            run = leading_run(ok)
            answer = torch.arange(start - 1, length - 2)
            for i in range(steps):
                reached[i] += int((run[answer] >= i).sum())
                right[i] += int((run[answer] >= i + 1).sum())
            accepted_at = run.tolist()
            for k in windows:
                done, calls = walk(accepted_at, start, length, k)
                head_calls[k][0] += done
                head_calls[k][1] += calls
                done, calls = ngram_walk(ids, start, k)
                ngram_calls[k][0] += done
                ngram_calls[k][1] += calls
    return Evaluation(
        accuracy=[c / max(n, 1) for c, n in zip(correct, counted, strict=True)],
        conditional=[r / max(n, 1) for r, n in zip(right, reached, strict=True)],
        tau={k: done / max(calls, 1) for k, (done, calls) in head_calls.items()},
        ngram_tau={k: done / max(calls, 1) for k, (done, calls) in ngram_calls.items()},
        tokens=tokens,
        greedy_answers=greedy_answers,
    )
