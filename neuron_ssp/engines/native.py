"""The speculative sampling loop, and plain decoding through the same backend for comparison.

Per iteration: the policy picks a window w <= k, the drafter proposes up to w-1 tokens, the policy
keeps a prefix of them (the cost policy weighs the proposal's evidence against the call's cost), the
target scores [last committed token] + draft at their cache positions in ONE call, and the acceptor
commits 1..w tokens. Rejected positions need no cleanup: the next call overwrites them (see backends.base).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

import torch

from neuron_ssp.backends.base import ModelBackend
from neuron_ssp.config import SamplingConfig
from neuron_ssp.drafters.base import Draft, Drafter
from neuron_ssp.errors import Problem, RuntimeProblem, UsageError
from neuron_ssp.speculation.acceptors import TokenAcceptor
from neuron_ssp.speculation.policies import WindowPolicy
from neuron_ssp.speculation.positions import require_room, target_slots
from neuron_ssp.speculation.sampling import SamplingParams, first_non_finite_row, next_token
from neuron_ssp.speculation.stats import GenerationStats

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


def check_room(backend: ModelBackend, prompt_len: int, max_new_tokens: int, field: str,
               extra_slots: int = 0) -> None:
    """Fail before the first call, not when the cache overflows half-way. Our loop writes
    `positions.target_slots` slots; an engine that writes more (transformers-neuronx's loop) says how
    many more with `extra_slots`, and a backend that pads every call to its window (NxD Inference: k wide)
    with its `padding_slots`."""
    if prompt_len == 0:
        raise UsageError(Problem("prompt", "", "the prompt is empty", "pass a non-empty prompt"))
    extra = extra_slots + getattr(backend, "padding_slots", 0)
    require_room(backend.n_positions, target_slots(prompt_len, max_new_tokens) + extra, prompt_len,
                 max_new_tokens, field)


def check_finite(logits: torch.Tensor, first_position: int, target: ModelBackend) -> None:
    """Refuse to emit tokens from logits that hold NaN or inf (rows scored from `first_position` on)."""
    row = first_non_finite_row(logits.view(-1, logits.shape[-1]))
    if row is not None:
        raise RuntimeProblem(Problem(
            "target.path", target.name,
            f"the target produced non-finite logits (NaN or inf) at position {first_position + row}",
            "check the target's weights and dtype (fp16 overflows are common: try bf16 or fp32)"))


class _Sequence:
    """Committed tokens in a preallocated buffer, with the EOS / max_new_tokens cut-off."""

    def __init__(self, prompt_ids: torch.Tensor, max_new_tokens: int, eos: Collection[int],
                 on_tokens: TokenCallback | None, on_commit: CommitCallback | None = None,
                 on_logits: LogitsCallback | None = None):
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
    def last(self) -> int:
        return int(self.buffer[self.length - 1])

    def committed(self) -> torch.Tensor:
        return self.buffer[: self.length]

    def extend(self, tokens: list[int], from_draft: int = 0, drafted: int = 0,
               logits: torch.Tensor | None = None) -> int:
        """Commit tokens up to EOS (kept) or the budget; returns how many were committed.

        `from_draft` (leading tokens that are accepted drafts) and `drafted` are reported to `on_commit`;
        `logits` (one target row per token) to `on_logits`."""
        kept = tokens[: self.remaining]
        for i, token in enumerate(kept):
            if token in self.eos:
                kept = kept[: i + 1]
                self.done = True
                break
        self.buffer[self.length: self.length + len(kept)] = torch.tensor(kept, dtype=torch.long)
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
        return self.buffer[self.prompt_len: self.length].tolist()


class SpeculativeGenerator:
    def __init__(self, target: ModelBackend, drafter: Drafter, acceptor: TokenAcceptor, policy: WindowPolicy,
                 sampling: SamplingConfig, k: int, rng: torch.Generator | None = None):
        if target.max_score_width is not None and k > target.max_score_width:
            raise UsageError(Problem("speculation.k", k, f"the target scores at most {target.max_score_width} "
                                     "positions per call (its compiled window)",
                                     f"set k <= {target.max_score_width} or recompile the target for k={k}"))
        self.target = target
        self.drafter = drafter
        self.acceptor = acceptor
        self.policy = policy
        self.sampling = sampling
        self.params = sampling_params(sampling)
        self.k = k
        self.rng = rng or torch.Generator(device=getattr(target, "device", "cpu"))

    def generate(self, prompt_ids: torch.Tensor, max_new_tokens: int, eos_token_ids: Collection[int] = (),
                 on_tokens: TokenCallback | None = None, *, on_commit: CommitCallback | None = None,
                 should_stop: StopCheck | None = None, on_logits: LogitsCallback | None = None) -> GenerationResult:
        check_room(self.target, prompt_ids.shape[0], max_new_tokens, "target.n_positions")
        self.rng.manual_seed(self.sampling.seed)
        self.policy.reset()
        stats = GenerationStats(k=self.k)
        seq = _Sequence(prompt_ids, max_new_tokens, eos_token_ids, on_tokens, on_commit, on_logits)
        start = time.perf_counter()

        self.drafter.begin(prompt_ids, max_new_tokens)  # checks the draft model's room before any call
        t0 = time.perf_counter()
        logits = self.target.prefill(prompt_ids)
        stats.time_draft_s += t0 - start
        stats.time_target_s += time.perf_counter() - t0
        check_finite(logits, seq.length - 1, self.target)
        seq.extend([next_token(logits, self.params, self.rng)], logits=logits)
        confidence = _confidence(logits, seq.last) if self.policy.uses_target_confidence else 1.0

        while not seq.done and not (should_stop and should_stop()):
            window = min(self.policy.window(confidence), self.k, seq.remaining)
            t0 = time.perf_counter()
            draft = self.drafter.propose(seq.committed(), window - 1) if window > 1 \
                else Draft.empty(self.target.vocab_size)
            draft = draft.prefix(self.policy.keep(draft, confidence))
            t1 = time.perf_counter()
            inputs = torch.cat([torch.tensor([seq.last]), draft.tokens])
            t2 = time.perf_counter()
            target_logits = self.target.score(inputs, seq.length - 1)
            stats.time_draft_s += t1 - t0
            stats.time_target_s += time.perf_counter() - t2
            check_finite(target_logits, seq.length - 1, self.target)

            if len(draft):
                tokens = self._accept(draft.tokens, draft.logits, target_logits)
            else:
                tokens = [next_token(target_logits[0], self.params, self.rng)]
            accepted = len(tokens) - 1
            stats.record_call(len(draft), accepted, seq.extend(tokens, accepted, len(draft), target_logits))
            self.policy.observe(len(draft), accepted)
            if self.policy.uses_target_confidence:
                confidence = _confidence(target_logits[accepted], tokens[-1])

        self.drafter.finish(seq.committed())
        stats.wall_s = time.perf_counter() - start
        stats.new_tokens = seq.length - seq.prompt_len
        return GenerationResult(seq.generated(), stats)

    def _accept(self, draft_ids: torch.Tensor, draft_logits: torch.Tensor, target_logits: torch.Tensor) -> list[int]:
        out = self.acceptor(draft_ids.view(1, -1), draft_logits.unsqueeze(0), target_logits.unsqueeze(0))
        tokens = out.view(-1).tolist()
        if not 1 <= len(tokens) <= len(draft_ids) + 1 or tokens[:-1] != draft_ids[: len(tokens) - 1].tolist():
            raise RuntimeProblem(Problem(
                "speculation.acceptor", type(self.acceptor).__name__,
                f"returned {tokens} for draft {draft_ids.tolist()}: an acceptor must return the first n-1 "
                "drafted tokens followed by one token of its choice (1 <= n <= drafted + 1)",
                "fix the acceptor's __call__ (the target's KV cache holds the drafted tokens)"))
        return tokens


def plain_generate(target: ModelBackend, prompt_ids: torch.Tensor, max_new_tokens: int,
                   sampling: SamplingConfig, eos_token_ids: Collection[int] = (),
                   on_tokens: TokenCallback | None = None) -> GenerationResult:
    """Plain autoregressive decoding of the target (RSp): the baseline every speedup is measured against."""
    check_room(target, prompt_ids.shape[0], max_new_tokens, "target.n_positions")
    params = sampling_params(sampling)
    stats = GenerationStats(k=1)
    seq = _Sequence(prompt_ids, max_new_tokens, eos_token_ids, on_tokens)
    start = time.perf_counter()
    logits = target.prefill(prompt_ids)
    stats.time_target_s = time.perf_counter() - start
    rng = torch.Generator(device=logits.device).manual_seed(sampling.seed)  # draws where the logits are
    check_finite(logits, seq.length - 1, target)
    seq.extend([next_token(logits, params, rng)])
    while not seq.done:
        t0 = time.perf_counter()
        logits = target.score(torch.tensor([seq.last]), seq.length - 1)[0]
        stats.time_target_s += time.perf_counter() - t0
        check_finite(logits, seq.length - 1, target)
        stats.record_call(0, 0, seq.extend([next_token(logits, params, rng)]))
    stats.wall_s = time.perf_counter() - start
    stats.new_tokens = seq.length - seq.prompt_len
    return GenerationResult(seq.generated(), stats)


def _confidence(logits: torch.Tensor, token: int) -> float:
    """The target's probability (temperature 1) for the token it just produced."""
    return float(logits.float().softmax(-1)[token])

