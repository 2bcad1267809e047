"""Is speculative sampling lossless on the real model? Compare the first two new tokens, sampled many
times with different seeds, from plain decoding and from SSp, by their total-variation distance.

The second token is the one the acceptor decides (the first comes from the prompt's logits in both),
so the prompt must be one where the drafter proposes after the first token: a prompt the answer
copies from. Logits are memoised per token prefix (`PrefixMemo`), so each sample costs only the
sampler's own work; the drafter, acceptor and generator run in full every time.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch

from neuron_ssp.config import SamplingConfig
from neuron_ssp.engines.native import SpeculativeGenerator, plain_generate
from neuron_ssp.errors import Problem, UsageError
from neuron_ssp.pipeline.pipeline import Pipeline
from neuron_ssp.tools.per_k import generator_for_k
from neuron_ssp.tools.prefix_memo import PrefixMemo
from neuron_ssp.tools.tv_distance import TvEstimate, estimate_tv

# The first two tokens are nearly always "The cat" (a small outcome space keeps the TV estimate tight),
# and the drafter proposes after "The" (the prompt holds "\nThe cat sat ...").
DEFAULT_PROMPT = "Copy this text exactly:\nThe cat sat on the mat."
NO_SECOND_TOKEN = -1  # the first token was a stop token

Pair = tuple[int, int]


@dataclass
class LosslessReport:
    samples: int  # per method
    temperature: float
    estimate: TvEstimate
    drafted_share: float  # SSp samples whose second token came through a draft check (drafted and kept)
    acceptance_rate: float  # of the drafted tokens in those checks
    forward_passes: int
    distinct_pairs: int
    top_pairs: list[tuple[Pair, int, int]]  # (pair, plain count, SSp count), most frequent first


class _Enough(Exception):
    """Raised from the commit callback once two tokens are committed: the rest is not needed."""


def check_lossless(
    pipeline: Pipeline,
    prompt: str,
    samples: int,
    temperature: float,
    seed: int = 0,
    on_step: Callable[[], None] | None = None,
) -> LosslessReport:
    if samples < 2:
        raise UsageError(Problem("--samples", samples, "must be >= 2", "pass e.g. --samples 4000"))
    if temperature <= 0:
        raise UsageError(
            Problem(
                "sampling.temperature",
                temperature,
                "greedy decoding has nothing to compare",
                "use a temperature > 0 (the check uses 1.0 unless --temperature is given)",
            )
        )
    sampling = pipeline.config.sampling.model_copy(update={"temperature": temperature})
    memo = PrefixMemo(pipeline.target)
    generator = _memo_generator(pipeline, memo, sampling)
    ids = pipeline.encode(prompt)
    eos = pipeline.eos_token_ids
    plain: list[Pair] = []
    ssp: list[Pair] = []
    drafted = accepted = drafted_samples = 0
    for i in range(samples):
        # distinct seeds for the two methods: with equal seeds both would draw the same first token
        plain_sampling = sampling.model_copy(update={"seed": seed + 2 * i})
        plain.append(_pair(plain_generate(memo, ids, 2, plain_sampling, eos).tokens))
        generator.sampling = sampling.model_copy(update={"seed": seed + 2 * i + 1})
        tokens, checked = _first_two(generator, ids, eos)
        ssp.append(_pair(tokens))
        if checked:
            drafted_samples += 1
            drafted += checked
            accepted += min(len(tokens) - 2, checked)
        if on_step:
            on_step()
    return LosslessReport(
        samples=samples,
        temperature=temperature,
        estimate=estimate_tv(plain, ssp, seed=seed),
        drafted_share=drafted_samples / samples,
        acceptance_rate=accepted / drafted if drafted else 0.0,
        forward_passes=memo.forward_passes,
        distinct_pairs=len(set(plain) | set(ssp)),
        top_pairs=_top_pairs(plain, ssp),
    )


def _memo_generator(pipeline: Pipeline, memo: PrefixMemo, sampling: SamplingConfig) -> SpeculativeGenerator:
    """The pipeline's generator rebuilt on the memoised target (and memoised draft model, if any)."""
    draft = PrefixMemo(pipeline.draft) if pipeline.draft is not None else None
    config = pipeline.config.model_copy(update={"sampling": sampling})
    shadow = dataclasses.replace(pipeline, config=config, target=memo, draft=draft)
    return generator_for_k(shadow, config.speculation.k)


def _first_two(generator: SpeculativeGenerator, ids: torch.Tensor, eos: set[int]) -> tuple[list[int], int]:
    """All tokens committed up to the call that brought the total to two or more (a full window first),
    and how many drafted tokens the target checked in the first call after the prompt's token: what the
    window policy kept of the proposal (the cost policy may keep none), as the loop reports it."""
    committed: list[int] = []
    checked: list[int] = []

    def collect(tokens: list[int], _accepted: int | None, drafted: int) -> None:
        if committed:  # not the token drawn from the prompt's logits
            checked.append(drafted)
        committed.extend(tokens)
        if len(committed) >= 2:
            raise _Enough

    with contextlib.suppress(_Enough):
        generator.generate(ids, generator.k + 1, eos, on_commit=collect)
    return committed, checked[0] if checked else 0


def _pair(tokens: list[int]) -> Pair:
    return tokens[0], tokens[1] if len(tokens) > 1 else NO_SECOND_TOKEN


def _top_pairs(plain: list[Pair], ssp: list[Pair], count: int = 8) -> list[tuple[Pair, int, int]]:
    tally: dict[Pair, list[int]] = {}
    for index, sample in enumerate((plain, ssp)):
        for pair in sample:
            tally.setdefault(pair, [0, 0])[index] += 1
    ranked = sorted(tally.items(), key=lambda item: -(item[1][0] + item[1][1]))
    return [(pair, n_plain, n_ssp) for pair, (n_plain, n_ssp) in ranked[:count]]
