"""Our speculative sampling engine, and plain decoding through the same loop.

Per iteration: the policy picks a window w <= k, the drafter proposes up to w-1 tokens, the policy
keeps a prefix of them (the cost policy weighs the proposal's evidence against the call's cost), the
target scores [last committed token] + draft at their cache positions in ONE call, and the acceptor
commits 1..w tokens. Rejected positions need no cleanup: the next call overwrites them (see backends.base).
The loop itself is `engines.continuous_batch.ContinuousBatchLoop`: `generate` runs it with one row, the server
with many, and both choose windows alike (the target's call cost goes to the loop either way).
"""

from __future__ import annotations

from collections.abc import Callable, Collection

import torch

from neuron_ssp.backends.base import ModelBackend
from neuron_ssp.config import SamplingConfig
from neuron_ssp.drafters.base import Drafter
from neuron_ssp.engines.base import GenerationResult, TokenCallback, sampling_params
from neuron_ssp.engines.continuous_batch import ContinuousBatchLoop
from neuron_ssp.engines.prefix_pool import PrefixPool
from neuron_ssp.engines.rows import Generator, RowCallbacks, RowSettings
from neuron_ssp.engines.slot_caches import SlotCaches
from neuron_ssp.errors import Problem, UsageError
from neuron_ssp.speculation.acceptors import TokenAcceptor
from neuron_ssp.speculation.call_cost import WidthCost
from neuron_ssp.speculation.policies import WindowPolicy


class SpeculativeGenerator(Generator):
    """A target, a drafter, an acceptor and a window policy: transformers-neuronx's three swappable pieces
    (and the policy); `generate` runs one request through our loop."""

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
        prefix_pool_bytes: int | None = None,
        settings_for: Callable[[SamplingConfig], RowSettings] | None = None,
    ):
        """`cost`: the target's call cost per row count, for a batch's goodput windows (`row_loop`);
        `prefix_pool_bytes`: prefix caching across a loop's requests with a pool of that many bytes (0: warm slots
        only), where the target's cache allows it (slot_caches.py); None: off. `settings_for`: the builder of a
        request's settings for a sampling config (a loaded pipeline's `request_settings`, so `generate` runs a
        request exactly as the server does); None: every request runs on this generator's own pieces."""
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
        self.prefix_pool_bytes = prefix_pool_bytes
        self.settings_for = settings_for
        # for acceptors and drafters that draw from a generator rather than the per-position noise
        self.rng = rng or torch.Generator(device=getattr(target, "device", "cpu"))

    def row_settings(self) -> RowSettings:
        """A request of `generate` with the generator's `sampling`: the builder's settings where it was given one,
        else the generator's own drafter (whatever the slot), acceptor and policy."""
        if self.settings_for is not None:
            return self.settings_for(self.sampling)
        drafter = self.drafter
        return RowSettings(
            sampling_params(self.sampling),
            self.sampling.seed,
            None if drafter is None else (lambda slot: drafter),
            self.acceptor,
            self.policy,
            self.rng,
        )

    def row_loop(self) -> ContinuousBatchLoop:
        """Requests as rows of our loop over the target's slots, windows chosen by goodput where the policy weighs
        so: one request alone chooses them as it would among others (the server's continuous batching)."""
        return ContinuousBatchLoop(self.target, self.k, self.cost, self._slot_caches())

    def _slot_caches(self) -> SlotCaches | None:
        """A new loop's caches: it starts knowing nothing of an earlier loop's requests."""
        if self.prefix_pool_bytes is None:
            return None
        pool = PrefixPool(self.prefix_pool_bytes) if self.prefix_pool_bytes else None
        return SlotCaches(self.target.slots, getattr(self.target, "prefix_blocks", None), pool)


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
    request = RowSettings(sampling_params(sampling), sampling.seed).request(
        prompt_ids, max_new_tokens, eos_token_ids, RowCallbacks(on_tokens=on_tokens)
    )
    return ContinuousBatchLoop(target, 1).run(request)
