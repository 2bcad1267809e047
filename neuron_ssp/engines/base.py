"""What every engine shares: the result, the callbacks, the room and finiteness checks, and a request's
committed tokens. Our loop and the libraries' loops import it from here, never from one another."""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

import torch

from neuron_ssp.backends.base import ModelBackend
from neuron_ssp.config import SamplingConfig
from neuron_ssp.errors import Problem, RuntimeProblem, UsageError
from neuron_ssp.speculation.sampling import SamplingParams, first_non_finite_row
from neuron_ssp.speculation.stats import GenerationStats
from neuron_ssp.topology.positions import require_room, target_slots

TokenCallback = Callable[[list[int]], None]
# (tokens committed by one step, how many of them (leading) are accepted draft tokens, how many tokens
# were drafted): the last token the target chose itself (a rejection's correction, a bonus token or a
# plain step). The second value is None when the origin is unknown (the library engine).
CommitCallback = Callable[[list[int], int | None, int], None]
StopCheck = Callable[[], bool]  # asked once per iteration; True ends the generation early (a cancel)
# the target's logits rows (n, V) that chose the n tokens about to be committed (logprobs); before on_commit
LogitsCallback = Callable[[torch.Tensor], None]


@dataclass
class GenerationResult:
    tokens: list[int]  # generated tokens only; ends with the EOS token when one was produced
    stats: GenerationStats


def sampling_params(sampling: SamplingConfig) -> SamplingParams:
    return SamplingParams(sampling.temperature, sampling.top_k, sampling.top_p)


def check_room(backend: ModelBackend, prompt_len: int, max_new_tokens: int, field: str, extra_slots: int = 0) -> None:
    """Fail before the first call, not when the cache overflows half-way. Our loop writes
    `positions.target_slots` slots; an engine that writes more (transformers-neuronx's loop) says how
    many more with `extra_slots`, and a backend that pads every call to its window (NxD Inference: k wide)
    with its `padding_slots`."""
    if prompt_len == 0:
        raise UsageError(Problem("prompt", "", "the prompt is empty", "pass a non-empty prompt"))
    extra = extra_slots + getattr(backend, "padding_slots", 0)
    require_room(
        backend.n_positions, target_slots(prompt_len, max_new_tokens) + extra, prompt_len, max_new_tokens, field
    )


def check_finite(logits: torch.Tensor, first_position: int, target: ModelBackend) -> None:
    """Refuse to emit tokens from logits that hold NaN or inf (rows scored from `first_position` on)."""
    row = first_non_finite_row(logits.view(-1, logits.shape[-1]))
    if row is not None:
        raise RuntimeProblem(
            Problem(
                "target.path",
                target.name,
                f"the target produced non-finite logits (NaN or inf) at position {first_position + row}",
                "check the target's weights and dtype (fp16 overflows are common: try bf16 or fp32)",
            )
        )


class Committed:
    """A request's committed tokens in a preallocated buffer, with the EOS / max_new_tokens cut-off and
    the callbacks that see each step's tokens."""

    def __init__(
        self,
        prompt_ids: torch.Tensor,
        max_new_tokens: int,
        eos: Collection[int],
        on_tokens: TokenCallback | None = None,
        on_commit: CommitCallback | None = None,
        on_logits: LogitsCallback | None = None,
    ):
        self.prompt_len = prompt_ids.shape[0]
        self.buffer = torch.empty(self.prompt_len + max_new_tokens, dtype=torch.long)
        self.buffer[: self.prompt_len] = prompt_ids
        self.length = self.prompt_len
        self.max_new_tokens = max_new_tokens
        self.eos = frozenset(eos)
        self.on_tokens = on_tokens
        self.on_commit = on_commit
        self.on_logits = on_logits
        self.done = False

    @property
    def remaining(self) -> int:
        return self.prompt_len + self.max_new_tokens - self.length

    @property
    def generated_count(self) -> int:
        """Output position of the next token."""
        return self.length - self.prompt_len

    @property
    def last(self) -> int:
        return int(self.buffer[self.length - 1])

    def committed(self) -> torch.Tensor:
        return self.buffer[: self.length]

    def extend(
        self, tokens: list[int], from_draft: int = 0, drafted: int = 0, logits: torch.Tensor | None = None
    ) -> int:
        """Commit tokens up to EOS (kept) or the budget; returns how many were committed.

        `from_draft` (leading tokens that are accepted drafts) and `drafted` are reported to `on_commit`;
        `logits` (one target row per token) to `on_logits`."""
        kept = tokens[: self.remaining]
        for i, token in enumerate(kept):
            if token in self.eos:
                kept = kept[: i + 1]
                self.done = True
                break
        self.buffer[self.length : self.length + len(kept)] = torch.tensor(kept, dtype=torch.long)
        self.length += len(kept)
        self.done = self.done or self.remaining == 0
        if self.on_logits and kept and logits is not None:
            self.on_logits(logits.view(-1, logits.shape[-1])[: len(kept)])
        if self.on_tokens and kept:
            self.on_tokens(kept)
        if self.on_commit and kept:
            self.on_commit(kept, min(from_draft, len(kept)), drafted)
        return len(kept)

    def generated(self) -> list[int]:
        return self.buffer[self.prompt_len : self.length].tolist()
