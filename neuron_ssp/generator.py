"""The speculative sampling loop, and plain decoding through the same backend for comparison.

Per iteration: the policy picks a window w <= k, the drafter proposes up to w-1 tokens, the target
scores [last committed token] + draft at their cache positions in ONE call, and the acceptor commits
1..w tokens. Rejected positions need no cleanup: the next call overwrites them (see backends.base).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

import torch

from neuron_ssp.acceptors import TokenAcceptor
from neuron_ssp.backends.base import ModelBackend
from neuron_ssp.config import SamplingConfig
from neuron_ssp.drafters.base import Drafter
from neuron_ssp.errors import Problem, RuntimeProblem, UsageError
from neuron_ssp.policies import FixedPolicy
from neuron_ssp.sampling import SamplingParams, next_token
from neuron_ssp.stats import GenerationStats

TokenCallback = Callable[[list[int]], None]


@dataclass
class GenerationResult:
    tokens: list[int]  # generated tokens only; ends with the EOS token when one was produced
    stats: GenerationStats


def sampling_params(sampling: SamplingConfig) -> SamplingParams:
    return SamplingParams(sampling.temperature, sampling.top_k, sampling.top_p)


def check_room(backend: ModelBackend, prompt_len: int, max_new_tokens: int, k: int, field: str) -> None:
    """Fail before the first call, not when the cache overflows half-way."""
    needed = prompt_len + max_new_tokens + k
    if prompt_len == 0:
        raise UsageError(Problem("prompt", "", "the prompt is empty", "pass a non-empty prompt"))
    if needed > backend.n_positions:
        raise UsageError(Problem(
            field, backend.n_positions,
            f"prompt ({prompt_len} tokens) + max_new_tokens ({max_new_tokens}) + k ({k}) = {needed} "
            f"exceeds the {backend.n_positions} cache positions",
            f"raise {field} to at least {needed} (within the model's limit), "
            "or shorten the prompt / lower --max-new-tokens"))


class _Sequence:
    """Committed tokens in a preallocated buffer, with the EOS / max_new_tokens cut-off."""

    def __init__(self, prompt_ids: torch.Tensor, max_new_tokens: int, eos: Collection[int],
                 on_tokens: TokenCallback | None):
        self.prompt_len = prompt_ids.shape[0]
        self.buffer = torch.empty(self.prompt_len + max_new_tokens, dtype=torch.long)
        self.buffer[: self.prompt_len] = prompt_ids
        self.length = self.prompt_len
        self.max_new_tokens = max_new_tokens
        self.eos = frozenset(eos)
        self.on_tokens = on_tokens
        self.done = False

    @property
    def remaining(self) -> int:
        return self.prompt_len + self.max_new_tokens - self.length

    @property
    def last(self) -> int:
        return int(self.buffer[self.length - 1])

    def committed(self) -> torch.Tensor:
        return self.buffer[: self.length]

    def extend(self, tokens: list[int]) -> int:
        """Commit tokens up to EOS (kept) or the budget; returns how many were committed."""
        kept = tokens[: self.remaining]
        for i, token in enumerate(kept):
            if token in self.eos:
                kept = kept[: i + 1]
                self.done = True
                break
        self.buffer[self.length: self.length + len(kept)] = torch.tensor(kept, dtype=torch.long)
        self.length += len(kept)
        self.done = self.done or self.remaining == 0
        if self.on_tokens and kept:
            self.on_tokens(kept)
        return len(kept)

    def generated(self) -> list[int]:
        return self.buffer[self.prompt_len: self.length].tolist()


class SpeculativeGenerator:
    def __init__(self, target: ModelBackend, drafter: Drafter, acceptor: TokenAcceptor, policy: FixedPolicy,
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
        self.rng = rng or torch.Generator()

    def generate(self, prompt_ids: torch.Tensor, max_new_tokens: int, eos_token_ids: Collection[int] = (),
                 on_tokens: TokenCallback | None = None) -> GenerationResult:
        check_room(self.target, prompt_ids.shape[0], max_new_tokens, self.k, "target.n_positions")
        self.rng.manual_seed(self.sampling.seed)
        self.policy.reset()
        stats = GenerationStats(k=self.k)
        seq = _Sequence(prompt_ids, max_new_tokens, eos_token_ids, on_tokens)
        start = time.perf_counter()

        logits = self.target.prefill(prompt_ids)
        self.drafter.begin(prompt_ids)
        stats.time_target_s += time.perf_counter() - start
        seq.extend([next_token(logits, self.params, self.rng)])
        confidence = _confidence(logits, seq.last) if self.policy.uses_target_confidence else 1.0

        while not seq.done:
            window = min(self.policy.window(confidence), self.k, seq.remaining)
            t0 = time.perf_counter()
            draft = self.drafter.propose(seq.committed(), window - 1, self.policy, self.params, self.rng) \
                if window > 1 else None
            t1 = time.perf_counter()
            drafted = len(draft) if draft is not None else 0
            inputs = torch.tensor([seq.last])
            if drafted:
                inputs = torch.cat([inputs, draft.tokens])
            target_logits = self.target.score(inputs, seq.length - 1)
            t2 = time.perf_counter()
            stats.time_draft_s += t1 - t0
            stats.time_target_s += t2 - t1

            if drafted:
                tokens = self._accept(draft.tokens, draft.logits, target_logits)
            else:
                tokens = [next_token(target_logits[0], self.params, self.rng)]
            accepted = len(tokens) - 1
            stats.record_call(drafted, accepted, seq.extend(tokens))
            self.policy.observe(drafted, accepted)
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
    check_room(target, prompt_ids.shape[0], max_new_tokens, 1, "target.n_positions")
    params = sampling_params(sampling)
    rng = torch.Generator().manual_seed(sampling.seed)
    stats = GenerationStats(k=1)
    seq = _Sequence(prompt_ids, max_new_tokens, eos_token_ids, on_tokens)
    start = time.perf_counter()
    logits = target.prefill(prompt_ids)
    stats.time_target_s = time.perf_counter() - start
    seq.extend([next_token(logits, params, rng)])
    while not seq.done:
        t0 = time.perf_counter()
        logits = target.score(torch.tensor([seq.last]), seq.length - 1)[0]
        stats.time_target_s += time.perf_counter() - t0
        stats.record_call(0, 0, seq.extend([next_token(logits, params, rng)]))
    stats.wall_s = time.perf_counter() - start
    stats.new_tokens = seq.length - seq.prompt_len
    return GenerationResult(seq.generated(), stats)


def _confidence(logits: torch.Tensor, token: int) -> float:
    """The target's probability (temperature 1) for the token it just produced."""
    return float(logits.float().softmax(-1)[token])

