"""`speculation.engine: library`: transformers-neuronx's own `SpeculativeGenerator` loop, our acceptor.

Useful to compare our loop with AWS's on the same compiled models. The library's loop differs from
ours in ways that matter, so they are handled or refused here, not discovered later:
- it drafts greedily (`DraftModelForSpeculation`, argmax), so the draft distribution is a point mass
  on each drafted token; the acceptor is given exactly that, which keeps rejection sampling lossless;
- its first token after the prompt is the target's argmax, whatever the sampling settings;
- from SDK 2.21 it wants a zero-padded `(bs, k)` result and counts it with `count_nonzero`, so an
  accepted token id 0 would be miscounted: we stop with a message instead of returning a wrong text;
- it always drafts k-1 tokens (policy 'fixed' only) and returns the tokens at the end (`on_tokens` is
  called once);
- it scores a full window from a slot that may reach sequence_length - 1 and refills the draft one slot
  past it: target and draft each need P+N+k-1 positions (neuron_ssp.topology.positions);
- `sample(eos_token_id=...)` takes ONE id (it compares tensors element-wise). Models such as Llama-3
  have several, so our acceptor adapter rewrites any other EOS it accepts into that one, which stops
  the library's loop there, and the engine puts the real id back;
- on 0.10-0.11 (7a30b42, c8d6bdc) the loop hands the last <= k tokens to `target.sample(..., top_k=1)`:
  greedy, whatever the sampling settings (a warning says so).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Collection
from typing import Any

import torch

from neuron_ssp.backends.neuron.api import NeuronxApi, load_neuronx
from neuron_ssp.backends.neuron.scoring import NeuronBackend
from neuron_ssp.config import Config, SamplingConfig
from neuron_ssp.drafters.base import point_masses
from neuron_ssp.engines.base import GenerationResult, TokenCallback, check_room
from neuron_ssp.errors import Problem, RuntimeProblem, UsageError
from neuron_ssp.speculation.stats import GenerationStats
from neuron_ssp.topology.positions import draft_slots, extra_target_slots, require_room

Acceptor = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class LibraryEngine:
    """Same `generate` as `SpeculativeGenerator`, run by transformers-neuronx's loop."""

    def __init__(
        self,
        target: NeuronBackend,
        draft: NeuronBackend,
        acceptor: Acceptor,
        sampling: SamplingConfig,
        k: int,
        rng: torch.Generator | None = None,
        api: NeuronxApi | None = None,
    ):
        if target.speculation_length != k:
            raise UsageError(
                Problem(
                    "speculation.k",
                    k,
                    f"the target was compiled for k={target.speculation_length}",
                    "load the target with the same speculation.k",
                )
            )
        self.target = target
        self.draft = draft
        self.acceptor = acceptor
        self.sampling = sampling
        self.k = k
        self.rng = rng
        self.api = api or load_neuronx()

    @classmethod
    def from_config(
        cls,
        config: Config,
        target: NeuronBackend,
        draft: NeuronBackend | None,
        acceptor: Acceptor,
        rng: torch.Generator | None = None,
    ) -> LibraryEngine:
        """Refuse the settings the library's loop cannot honour, then build the engine."""
        spec = config.speculation
        problems = []
        if config.platform.backend != "neuron":
            problems.append(
                Problem(
                    "speculation.engine",
                    spec.engine,
                    "engine 'library' is transformers-neuronx's loop and runs Neuron models only",
                    "set platform.backend: neuron, or engine: native",
                )
            )
        if spec.drafter != "model" or draft is None:
            problems.append(
                Problem(
                    "speculation.drafter",
                    spec.drafter,
                    "engine 'library' drafts with a draft model",
                    "set speculation.drafter: model with a draft section, or engine: native",
                )
            )
        if spec.policy != "fixed":
            problems.append(
                Problem(
                    "speculation.policy",
                    spec.policy,
                    "engine 'library' always drafts k-1 tokens",
                    "use policy: fixed, or engine: native",
                )
            )
        if problems:
            raise UsageError(problems)
        api = load_neuronx()
        if config.sampling.temperature > 0:
            tail = (
                f"; transformers-neuronx {api.version} (0.10-0.11 API) also finishes the last <= k tokens "
                "greedily (target.sample(top_k=1))"
                if api.finishes_greedily
                else ""
            )
            warnings.warn(
                "engine 'library' picks the first token after the prompt greedily (transformers-neuronx's "
                f"loop){tail}; the rest follows the sampling settings. engine native samples every token",
                stacklevel=2,
            )
        assert draft is not None
        return cls(target, draft, acceptor, config.sampling, spec.k, rng, api)

    def generate(
        self,
        prompt_ids: torch.Tensor,
        max_new_tokens: int,
        eos_token_ids: Collection[int] = (),
        on_tokens: TokenCallback | None = None,
    ) -> GenerationResult:
        prompt_len = prompt_ids.shape[0]
        check_room(self.target, prompt_len, max_new_tokens, "target.n_positions", extra_target_slots("library", self.k))
        require_room(self.draft.n_positions, draft_slots(prompt_len, max_new_tokens, "library", self.k), prompt_len,
                     max_new_tokens, "draft.n_positions")
        if self.rng is not None:
            self.rng.manual_seed(self.sampling.seed)
        stats = GenerationStats(k=self.k)
        spec = self.api.speculation
        eos = set(eos_token_ids)
        stop_id = library_stop_id(self.target.model, eos)
        adapter = adapt_acceptor(self.acceptor, self.api, self.k, self.target.vocab_size, stats, eos, stop_id)
        loop = spec.SpeculativeGenerator(
            _Timed(spec.DraftModelForSpeculation(self.draft.model), stats, "time_draft_s"),
            _Timed(self.target.model, stats, "time_target_s"),
            self.k,
            adapter,
        )
        start = time.perf_counter()
        out = loop.sample(prompt_ids.view(1, -1), sequence_length=prompt_len + max_new_tokens, eos_token_id=stop_id)
        stats.wall_s = time.perf_counter() - start
        tokens = _cut_at_eos(out[0, prompt_len : prompt_len + max_new_tokens].tolist(), eos)
        if tokens and tokens[-1] == stop_id and adapter.rewritten_eos is not None:
            tokens[-1] = adapter.rewritten_eos  # the EOS our acceptor accepted, before it became stop_id
        stats.new_tokens = len(tokens)
        if on_tokens and tokens:
            on_tokens(tokens)
        return GenerationResult(tokens, stats)


def library_stop_id(model: Any, eos: set[int]) -> int | None:
    """The one EOS id the library's loop is given: the model config's first one when it is ours, else the smallest."""
    configured = getattr(getattr(model, "config", None), "eos_token_id", None)
    first = configured[0] if isinstance(configured, list) and configured else configured
    if isinstance(first, int) and first in eos:
        return first
    return min(eos) if eos else None


def adapt_acceptor(
    acceptor: Acceptor,
    api: NeuronxApi,
    k: int,
    vocab_size: int,
    stats: GenerationStats,
    eos: set[int] | None = None,
    stop_id: int | None = None,
) -> Any:
    """Our acceptor as a subclass of the installed library's `TokenAcceptor`, in either generation's shape.

    Any accepted EOS other than `stop_id` is rewritten to `stop_id` (remembered in `rewritten_eos`), so
    the library's single-id check stops at every EOS of the model."""
    others = (eos or set()) - {stop_id}

    class LibraryAcceptor(api.speculation.TokenAcceptor):  # type: ignore[name-defined,misc]
        rewritten_eos: int | None = None

        def __call__(
            self, draft_ids: torch.Tensor, draft_scores: torch.Tensor, target_scores: torch.Tensor
        ) -> torch.Tensor:
            ids = draft_ids.reshape(1, -1)
            target = target_scores if target_scores.dim() == 3 else target_scores.unsqueeze(0)  # SDK < 2.21: (k, V)
            drafted = point_masses(ids[0], vocab_size).unsqueeze(0)  # the library drafts by argmax
            tokens = torch.as_tensor(acceptor(ids, drafted, target)).reshape(1, -1).to(torch.int64)
            for i, token in enumerate(tokens[0].tolist()):
                if token in others and stop_id is not None:
                    self.rewritten_eos = token
                    tokens = tokens[:, : i + 1].clone()
                    tokens[0, i] = stop_id
                    break
            n = tokens.shape[1]
            stats.record_call(ids.shape[1], n - 1, n)
            if not api.batched_acceptor:
                return tokens
            if bool((tokens == 0).any()):
                raise RuntimeProblem(
                    Problem(
                        "speculation.engine",
                        "library",
                        f"token id 0 was accepted ({tokens[0].tolist()}); transformers-neuronx "
                        f"{api.version} counts accepted tokens with count_nonzero and would drop it",
                        "use speculation.engine: native (same acceptor, same compiled models)",
                    )
                )
            padded = torch.zeros(1, k, dtype=torch.int64)
            padded[0, :n] = tokens[0]
            return padded

    return LibraryAcceptor()


class _Timed:
    """Delegates to a model or draft provider and adds the time of every call to one stats field."""

    def __init__(self, inner: Any, stats: GenerationStats, field: str):
        self._inner = inner
        self._stats = stats
        self._field = field

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._timed(self._inner, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._inner, name)
        if not callable(attribute):
            return attribute
        return lambda *args, **kwargs: self._timed(attribute, *args, **kwargs)

    def _timed(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return func(*args, **kwargs)
        finally:
            setattr(self._stats, self._field, getattr(self._stats, self._field) + time.perf_counter() - start)


def _cut_at_eos(tokens: list[int], eos: set[int]) -> list[int]:
    for i, token in enumerate(tokens):
        if token in eos:
            return tokens[: i + 1]
    return tokens
