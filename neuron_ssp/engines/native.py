"""Our speculative sampling engine for one request at a time, and plain decoding through the same loop.

Per iteration: the policy picks a window w <= k, the drafter proposes up to w-1 tokens, the policy
keeps a prefix of them (the cost policy weighs the proposal's evidence against the call's cost), the
target scores [last committed token] + draft at their cache positions in ONE call, and the acceptor
commits 1..w tokens. Rejected positions need no cleanup: the next call overwrites them (see backends.base).
The loop itself is `engines.batch.BatchLoop`, here with one row; the server runs it with many.
"""

from __future__ import annotations

from collections.abc import Collection

import torch

from neuron_ssp.backends.base import ModelBackend
from neuron_ssp.config import SamplingConfig
from neuron_ssp.drafters.base import Drafter
from neuron_ssp.engines.base import (
    CommitCallback,
    GenerationResult,
    LogitsCallback,
    StopCheck,
    TokenCallback,
    sampling_params,
)
from neuron_ssp.engines.batch import BatchLoop
from neuron_ssp.engines.rows import RowRequest
from neuron_ssp.errors import Problem, UsageError
from neuron_ssp.speculation.acceptors import TokenAcceptor
from neuron_ssp.speculation.call_cost import WidthCost
from neuron_ssp.speculation.policies import WindowPolicy


class SpeculativeGenerator:
    """A target, a drafter, an acceptor and a window policy: transformers-neuronx's three swappable pieces
    (and the policy), generating one request at a time."""

    def __init__(
        self,
        target: ModelBackend,
        drafter: Drafter | None,
        acceptor: TokenAcceptor,
        policy: WindowPolicy,
        sampling: SamplingConfig,
        k: int,
        rng: torch.Generator | None = None,
        cost: WidthCost | None = None,
    ):
        """`cost`: the target's call cost per row count, for a batch's goodput windows (`row_loop`)."""
        if target.max_score_width is not None and k > target.max_score_width:
            raise UsageError(
                Problem(
                    "speculation.k",
                    k,
                    f"the target scores at most {target.max_score_width} positions per call (its compiled window)",
                    f"set k <= {target.max_score_width} or recompile the target for k={k}",
                )
            )
        self.target = target
        self.drafter = drafter
        self.acceptor = acceptor
        self.policy = policy
        self.sampling = sampling
        self.params = sampling_params(sampling)
        self.k = k
        self.cost = cost
        # for acceptors and drafters that draw from a generator rather than the per-position noise
        self.rng = rng or torch.Generator(device=getattr(target, "device", "cpu"))

    def generate(
        self,
        prompt_ids: torch.Tensor,
        max_new_tokens: int,
        eos_token_ids: Collection[int] = (),
        on_tokens: TokenCallback | None = None,
        *,
        on_commit: CommitCallback | None = None,
        should_stop: StopCheck | None = None,
        on_logits: LogitsCallback | None = None,
    ) -> GenerationResult:
        self.rng.manual_seed(self.sampling.seed)
        drafter = self.drafter  # one request at a time: the generator's own drafter, whatever the slot
        request = RowRequest(
            prompt_ids,
            max_new_tokens,
            self.params,
            self.sampling.seed,
            eos_token_ids,
            None if drafter is None else (lambda slot: drafter),
            self.acceptor,
            self.policy,
            on_tokens,
            on_commit,
            on_logits,
            should_stop,
        )
        return BatchLoop(self.target, self.k).run(request)

    def row_loop(self) -> BatchLoop:
        """Requests as rows of our loop over the target's slots (the server's continuous batching)."""
        return BatchLoop(self.target, self.k, self.cost)


def plain_generate(
    target: ModelBackend,
    prompt_ids: torch.Tensor,
    max_new_tokens: int,
    sampling: SamplingConfig,
    eos_token_ids: Collection[int] = (),
    on_tokens: TokenCallback | None = None,
) -> GenerationResult:
    """Plain autoregressive decoding of the target (RSp): the baseline every speedup is measured against,
    through the same loop (a row without a drafter), drawing from the same (seed, position) noise."""
    request = RowRequest(
        prompt_ids, max_new_tokens, sampling_params(sampling), sampling.seed, eos_token_ids, on_tokens=on_tokens
    )
    return BatchLoop(target, 1).run(request)
