"""Token acceptors: decide which drafted tokens the target keeps, and add the target's own token.

Call shape is transformers-neuronx's `TokenAcceptor`, so an acceptor written for one works with the
other: `acceptor(draft_ids (1, m), draft_scores (1, m, V), target_scores (1, m+1, V))`. Ours return
the committed tokens `(1, n)`, 1 <= n <= m+1: the first n-1 drafted tokens plus one from the target.
Acceptors that follow the library's own convention (a zero-padded `(bs, k)` tensor whose length is
counted with `count_nonzero`) are wrapped by `ZeroPaddedAcceptor` when loaded as plug-ins.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from typing import Any

import torch

from neuron_ssp.config import did_you_mean, greedy_acceptor_problem
from neuron_ssp.errors import Problem, UsageError
from neuron_ssp.speculation.position_noise import PositionNoise, draw
from neuron_ssp.speculation.sampling import SamplingParams, logits_to_probs, sample


def neuron_base_class() -> type:
    """transformers-neuronx's `TokenAcceptor` when it imports, else `object`: a base for acceptors that
    should pass the library's own isinstance checks on Neuron and still import everywhere else."""
    try:
        return importlib.import_module("transformers_neuronx.speculation").TokenAcceptor
    except ImportError:
        return object


class TokenAcceptor(neuron_base_class()):  # type: ignore[misc]
    """Base class of our acceptors: results are variable-length `(1, n)`, never zero-padded.

    Where transformers-neuronx imports, this subclasses its `TokenAcceptor`, so the library's own
    code accepts ours as one of its acceptors. Scores may live on any device; the random generator
    must live on the same one.

    `noise`: set by our loop before each call to the noise of the positions the call judges (its first
    row's output position on); an acceptor that draws from it instead of `generator` keeps a seeded
    request's output independent of windows and batch (position_noise.py). Any other acceptor stays as
    lossless as it is, but its output then depends on how many numbers earlier steps drew.
    """

    noise: PositionNoise | None = None

    def __init__(self, sampling: SamplingParams | None = None, generator: torch.Generator | None = None):
        self.sampling = sampling or SamplingParams()
        self.generator = generator

    def __call__(
        self, draft_ids: torch.Tensor, draft_scores: torch.Tensor, target_scores: torch.Tensor
    ) -> torch.Tensor:
        raise NotImplementedError


class ProbabilisticAcceptor(TokenAcceptor):
    """Leviathan et al. / Chen et al. rejection sampling with residual resampling.

    Keeps draft token d with probability min(1, p(d)/q(d)); on the first rejection draws from
    norm(max(0, p - q)); if all are kept, draws a bonus token from the target's last row. The output
    is distributed exactly as the target's, for any temperature/top-k/top-p applied to both p and q.

    At temperature 0 p and q are point masses and the rule keeps d exactly when it is the target's
    argmax, then adds the target's argmax: greedy acceptance, computed as such rather than through
    (m+1, V) one-hots and a draw from one (~4 ms a step on the embedded model's 49k vocabulary).

    With per-position noise (our loop sets `noise`), each position's token is the one plain sampling
    draws there and a drafted token is kept when it equals it (`coupled_acceptance`): for point-mass
    drafts the same law as the rule above, and the output is plain sampling's for the same seed.
    """

    def __call__(
        self, draft_ids: torch.Tensor, draft_scores: torch.Tensor, target_scores: torch.Tensor
    ) -> torch.Tensor:
        if self.sampling.greedy:
            return greedy_acceptance(draft_ids, target_scores)
        if self.noise is not None:
            return coupled_acceptance(draft_ids, target_scores, self.sampling, self.noise)
        p = logits_to_probs(target_scores[0], self.sampling)
        ids = draft_ids[0].to(p.device)
        m = ids.shape[0]
        kept = m
        if m:
            q = logits_to_probs(draft_scores[0].to(p.device), self.sampling)
            rows = torch.arange(m, device=p.device)
            p_d, q_d = p[rows, ids], q[rows, ids]
            u = torch.rand(m, generator=self.generator, device=p.device)
            # keep d only when u*q(d) < p(d) holds: a NaN on either side rejects (NaN compares False)
            rejected = (~(u * q_d < p_d)).nonzero()
            if rejected.numel():
                kept = int(rejected[0])
                residual = (p[kept] - q[kept]).clamp_min(0.0)
                total = residual.sum()
                last_row = residual / total if bool(torch.isfinite(total)) and total > 0 else p[kept]
                return torch.cat([ids[:kept], sample(last_row, self.generator).view(1)]).view(1, -1)
        return torch.cat([ids[:kept], sample(p[kept], self.generator).view(1)]).view(1, -1)


class GreedyAcceptor(TokenAcceptor):
    """Keep drafted tokens while they equal the target's argmax: output == plain greedy decoding.

    It refuses a temperature above 0: it would ignore it and return greedy tokens mixed with sampled
    ones (the first token and plain steps are sampled), which is neither what was asked nor lossless.
    """

    def __init__(self, sampling: SamplingParams | None = None, generator: torch.Generator | None = None):
        super().__init__(sampling, generator)
        problem = greedy_acceptor_problem("greedy", self.sampling.temperature)
        if problem is not None:
            raise UsageError(problem)

    def __call__(
        self, draft_ids: torch.Tensor, draft_scores: torch.Tensor, target_scores: torch.Tensor
    ) -> torch.Tensor:
        return greedy_acceptance(draft_ids, target_scores)


def greedy_acceptance(draft_ids: torch.Tensor, target_scores: torch.Tensor) -> torch.Tensor:
    """The drafted tokens up to the first that is not the target's argmax, then the target's argmax."""
    best = target_scores[0].argmax(-1)
    ids = draft_ids[0].to(best.device)
    m = ids.shape[0]
    mismatch = (ids != best[:m]).nonzero()
    kept = int(mismatch[0]) if mismatch.numel() else m
    return torch.cat([ids[:kept], best[kept : kept + 1]]).view(1, -1)


def coupled_acceptance(
    draft_ids: torch.Tensor, target_scores: torch.Tensor, sampling: SamplingParams, noise: PositionNoise
) -> torch.Tensor:
    """The drafted tokens while each equals the token plain sampling draws at its position from the target's
    row with the same noise, then that drawn token (position_noise.py says why this is lossless)."""
    ids = draft_ids[0].tolist()
    for j, drafted in enumerate(ids):
        token = draw(target_scores[0, j], sampling, noise, j)
        if token != drafted:
            return torch.tensor(ids[:j] + [token]).view(1, -1)
    return torch.tensor(ids + [draw(target_scores[0, len(ids)], sampling, noise, len(ids))]).view(1, -1)


class TypicalAcceptor(TokenAcceptor):
    """Medusa-style typical acceptance: LOSSY, opt-in.

    Keeps d when p(d) > min(threshold, alpha * exp(-H(p))): plausible tokens pass even when the draft
    over-weights them, so acceptance rises but the output distribution is no longer the target's.
    """

    def __init__(
        self,
        sampling: SamplingParams | None = None,
        generator: torch.Generator | None = None,
        threshold: float = 0.09,
        alpha: float = 0.3,
    ):
        super().__init__(sampling, generator)
        self.threshold = threshold
        self.alpha = alpha

    def __call__(
        self, draft_ids: torch.Tensor, draft_scores: torch.Tensor, target_scores: torch.Tensor
    ) -> torch.Tensor:
        raw = target_scores[0].float().softmax(-1)
        ids = draft_ids[0].to(raw.device)
        m = ids.shape[0]
        entropy = -(raw * raw.clamp_min(1e-30).log()).sum(-1)
        bar = torch.minimum(torch.full_like(entropy, self.threshold), self.alpha * torch.exp(-entropy))
        fails = (raw[torch.arange(m, device=raw.device), ids] <= bar[:m]).nonzero()
        kept = int(fails[0]) if fails.numel() else m
        last = sample(logits_to_probs(target_scores[0, kept], self.sampling), self.generator)
        return torch.cat([ids[:kept], last.view(1)]).view(1, -1)


class ZeroPaddedAcceptor(TokenAcceptor):
    """Adapts an acceptor that returns transformers-neuronx's zero-padded `(bs, k)` result."""

    def __init__(self, inner: Any):
        super().__init__()
        self.inner = inner

    def __call__(
        self, draft_ids: torch.Tensor, draft_scores: torch.Tensor, target_scores: torch.Tensor
    ) -> torch.Tensor:
        out = torch.as_tensor(self.inner(draft_ids, draft_scores, target_scores)).view(1, -1)
        if out.shape[1] < target_scores.shape[1]:
            return out  # already variable-length (e.g. the library's ReferenceTokenAcceptor)
        return out[:, : int(torch.count_nonzero(out[0]))]


BUILTIN: dict[str, type[TokenAcceptor]] = {
    "probabilistic": ProbabilisticAcceptor,
    "greedy": GreedyAcceptor,
    "typical": TypicalAcceptor,
}


def build_acceptor(spec: str, sampling: SamplingParams, generator: torch.Generator | None) -> TokenAcceptor:
    """A built-in name or a `module:Class` plug-in -> a ready acceptor."""
    cls = acceptor_class(spec)
    if spec in BUILTIN:
        return cls(sampling, generator)
    params = inspect.signature(cls).parameters
    kwargs = {name: value for name, value in (("sampling", sampling), ("generator", generator)) if name in params}
    try:
        acceptor = cls(**kwargs)
    except TypeError as exc:
        raise UsageError(
            Problem(
                "speculation.acceptor",
                spec,
                f"the class cannot be built: {exc}",
                "give it an __init__ whose arguments are optional, or only `sampling` and `generator`",
            )
        ) from None
    return acceptor if isinstance(acceptor, TokenAcceptor) else ZeroPaddedAcceptor(acceptor)


def acceptor_class(spec: str) -> type:
    """The class a built-in name or a `module:Class` plug-in names, imported and checked (before any model loads)."""
    if spec in BUILTIN:
        return BUILTIN[spec]
    if ":" not in spec:
        raise UsageError(
            Problem(
                "speculation.acceptor",
                spec,
                "unknown acceptor",
                f"{did_you_mean(spec, list(BUILTIN))}use one of {', '.join(BUILTIN)}, or a plug-in as 'module:Class'",
            )
        )
    cls = _import_plugin(spec)
    required = [
        name
        for name, param in inspect.signature(cls).parameters.items()
        if param.default is param.empty
        and param.kind not in (param.VAR_POSITIONAL, param.VAR_KEYWORD)
        and name not in ("sampling", "generator")
    ]
    if required:
        raise UsageError(
            Problem(
                "speculation.acceptor",
                spec,
                f"the class cannot be built: its __init__ requires {', '.join(required)}",
                "give it an __init__ whose arguments are optional, or only `sampling` and `generator`",
            )
        )
    return cls


def _import_plugin(spec: str) -> type:
    module_name, _, class_name = spec.partition(":")
    try:
        module = _import_from_cwd_first(module_name)
    except Exception as exc:  # any import-time failure is the plug-in's, reported as such
        raise UsageError(
            Problem(
                "speculation.acceptor",
                spec,
                f"module '{module_name}' does not import ({type(exc).__name__}: {exc})",
                f"run from the directory that contains {module_name.replace('.', '/')}.py "
                f"(now: {os.getcwd()}), or install the module",
            )
        ) from None
    cls = getattr(module, class_name, None)
    if cls is None:
        raise UsageError(
            Problem(
                "speculation.acceptor",
                spec,
                f"module '{module_name}' has no '{class_name}'",
                "check the class name after the ':'",
            )
        )
    if not isinstance(cls, type) or not any("__call__" in vars(base) for base in cls.__mro__[:-1]):
        raise UsageError(
            Problem(
                "speculation.acceptor",
                spec,
                f"'{class_name}' is not a class with __call__",
                "define __call__(self, draft_ids, draft_scores, target_scores)",
            )
        )
    return cls


def _import_from_cwd_first(module_name: str) -> Any:
    """Import with the working directory first on sys.path, as uvicorn does for `module:attr`
    (its `--app-dir`, default '.'): the console script's sys.path starts at its own bin/ directory,
    so `my_acceptors.py` next to the user would otherwise not be found."""
    cwd = os.getcwd()
    sys.path.insert(0, cwd)
    try:
        return importlib.import_module(module_name)
    finally:
        sys.path.remove(cwd)  # the first occurrence: the one inserted above
