"""A row's logits processors: its grammar and sampling controls, applied where the loop draws and accepts.

Every processor is a function of the row's committed tokens and, inside a speculation window, of the draft path
before the position: row j of a window scoring [last committed] + d_1..d_m is processed as if d_1..d_j were committed.
Plain decoding and speculation then draw from the same processed distribution at every position, so greedy
speculation equals plain greedy decoding and the acceptors stay lossless (both sides see the same transform; vLLM
V1 masks drafts the same way, `structured_output/__init__.py` grammar_bitmask). The committed state moves only when
tokens are committed (`commit`).

Order, as vLLM's sampler applies them: logit_bias, min_tokens (the row's stop ids masked), the penalties
(repetition: prompt and output tokens, HF's divide-positive / multiply-negative; presence and frequency: output
tokens, OpenAI's), then the grammar's mask; temperature, min_p, top-k and top-p follow in `logits_to_probs`.
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np
import torch

from neuron_ssp.errors import Problem, RuntimeProblem
from neuron_ssp.speculation.controls import RequestControls
from neuron_ssp.speculation.grammar import GrammarMatcher, set_ids


class RowProcessor:
    """One request's processors over its committed tokens; `process` for the rows the loop draws from."""

    def __init__(
        self,
        controls: RequestControls,
        vocab_size: int,
        prompt_ids: torch.Tensor,
        stop_ids: Collection[int],
        eos_ids: Collection[int] = (),
        grammar: GrammarMatcher | None = None,
    ):
        """`stop_ids`: the ids that end the row (its EOS unless ignore_eos, and its stop_token_ids): what
        min_tokens masks; `eos_ids`: the model's EOS ids, on which a grammar ends."""
        self.controls = controls
        self.vocab_size = vocab_size
        self.grammar = grammar
        self.generated = 0
        self._eos = frozenset(eos_ids)
        self._ended = False
        self._stop_ids = torch.tensor(sorted(stop_ids), dtype=torch.long)
        self._bias_ids = torch.tensor([token for token, _ in controls.logit_bias], dtype=torch.long)
        self._bias = torch.tensor([bias for _, bias in controls.logit_bias], dtype=torch.float32)
        self._penalised = (
            controls.repetition_penalty != 1.0 or controls.presence_penalty != 0.0 or controls.frequency_penalty != 0.0
        )
        self._in_prompt = torch.zeros(vocab_size, dtype=torch.bool)
        self._in_prompt[prompt_ids.long()] = True
        self._counts = torch.zeros(vocab_size, dtype=torch.float32)  # output tokens committed, per id

    def process(self, logits: torch.Tensor, path: list[int]) -> torch.Tensor:
        """(n, V) logits -> processed copies; row j was scored after the committed tokens and
        path[:len(path) - n + 1 + j] (a window: n = len(path) + 1; a draft's next token: n = 1)."""
        rows = logits.shape[0]
        out = logits.float()
        first = len(path) - rows + 1  # path tokens before row 0
        if len(self._bias_ids) or self.controls.min_tokens:
            out = out.clone()
        if len(self._bias_ids):
            out[:, self._bias_ids] += self._bias.to(out.device)
        if self.controls.min_tokens and len(self._stop_ids):
            for j in range(rows):
                if self.generated + first + j < self.controls.min_tokens:
                    out[j, self._stop_ids] = float("-inf")
        if self._penalised:
            out = self._penalise(out, path, first)
        if self.grammar is not None:
            out = self._masked(out, logits, path, rows)
        return out

    def _masked(self, out: torch.Tensor, logits: torch.Tensor, path: list[int], rows: int) -> torch.Tensor:
        """The grammar's masks along the path applied (-inf where it refuses). A mask is mostly one value (a few
        tokens allowed in JSON's structure, nearly all inside a string), so each row is written through the short
        list of ids: torch's dense bool ops cost ~0.3 ms a row on the embedded model's 49,152 tokens."""
        words = self.grammar.words_along(path, rows)  # type: ignore[union-attr]
        if not bool(words.any(-1).all()):
            raise RuntimeProblem(
                Problem(
                    grammar_field(self.controls),
                    self.controls.grammar.kind if self.controls.grammar else None,
                    "the grammar allows no token of this model's vocabulary here (a character or string it requires "
                    "has no token)",
                    "write the grammar with text this tokenizer can spell",
                )
            )
        masked = torch.stack([_through(out[j], words[j]) for j in range(rows)])
        if self.controls.min_tokens:  # where min_tokens left the grammar nothing (it can only end here), it wins
            for j in masked.isneginf().all(-1).nonzero().flatten().tolist():
                masked[j] = _through(logits[j].float(), words[j])
        return masked

    def _penalise(self, out: torch.Tensor, path: list[int], first: int) -> torch.Tensor:
        controls = self.controls
        counts = self._counts.to(out.device).clone()
        for token in path[:first]:
            counts[token] += 1
        rows = []
        for j in range(out.shape[0]):
            if j:
                counts[path[first + j - 1]] += 1
            row = out[j]
            if controls.repetition_penalty != 1.0:
                seen = self._in_prompt.to(out.device) | (counts > 0)
                penalised = torch.where(row > 0, row / controls.repetition_penalty, row * controls.repetition_penalty)
                row = torch.where(seen, penalised, row)
            if controls.frequency_penalty or controls.presence_penalty:
                row = row - controls.frequency_penalty * counts - controls.presence_penalty * (counts > 0).float()
            rows.append(row)
        return torch.stack(rows)

    def valid_prefix(self, path: list[int]) -> int:
        """How many leading tokens of a proposal may be scored: all, or those before the first the grammar
        refuses (and nothing after the grammar's end)."""
        return len(path) if self.grammar is None else self.grammar.valid_prefix(path)

    def forced(self) -> list[int]:
        """The tokens the grammar forces next: drafts at the front of the proposal, judged by the target."""
        return [] if self.grammar is None else self.grammar.forced()

    def commit(self, tokens: list[int]) -> None:
        """These tokens are committed (after the target judged them)."""
        if self.grammar is not None:
            self.grammar.commit(tokens)
            self._ended = self._ended or any(token in self._eos for token in tokens)
        for token in tokens:
            self._counts[token] += 1
        self.generated += len(tokens)

    @property
    def finished(self) -> bool:
        """The grammar has ended on EOS: nothing may follow, whatever ignore_eos says."""
        return self._ended


def grammar_field(controls: RequestControls) -> str:
    return controls.grammar.field if controls.grammar is not None else "grammar"


def _through(row: torch.Tensor, words: np.ndarray) -> torch.Tensor:
    """`row` where the packed mask `words` allows, -inf elsewhere, written through whichever id list is shorter."""
    full = int(np.count_nonzero(words == 0xFF))
    if 2 * full * 8 <= row.shape[0]:  # few tokens allowed: copy them into a row of -inf
        ids = torch.from_numpy(set_ids(words)).to(row.device)
        out = torch.full_like(row, float("-inf"))
        out[ids] = row[ids]
        return out
    refused = set_ids(~words)
    out = row.clone()
    out[torch.from_numpy(refused[refused < row.shape[0]]).to(row.device)] = float("-inf")
    return out
