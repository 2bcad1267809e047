"""Before the first request: does the k-wide scoring window agree with one-token decoding?

The speculative loop trusts `speculative_forward` to score k tokens exactly as k one-token `forward`
calls at the same cache positions would. A library build that gets this wrong produces fluent
garbage with no error: the snapshot 0623de2 (April 2024, inside 0.10.x) pads a window to the smallest
context bucket and caps its cache_ids at that bucket - 1 (base.py lines 273-287
`_prepare_for_par_ctx_rhs_padding` and 291-312 `_pad_cache_ids`, `torch.minimum(cache_ids_pad,
estimate-1)`), so every window at cache position >= 64 reads and writes the wrong slots. NxD Inference
loads run the same test on their speculation model (labelled with `library_label`).

So after load we prefill 8 tokens of a natural-language passage, score the rest window by window up
to MIN_PAST_EDGE positions past that bucket edge, each window once with `speculative_forward` and once
as one-token calls at the same slots, and judge the two regions on either side of the edge on their
own (`neuron_ssp.backends.window_check`: argmax agreement, KL and the logit difference per position).
Both ways write the same tokens to the same slots, so the cache state is the same whichever runs
last; the test leaves the cache stale, which is the state every generation starts from anyway.
bf16 graphs are not bit-identical between the two networks, which is why a small inexact agreement
is a warning and not a failure.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from neuron_ssp.backends.base import ModelBackend
from neuron_ssp.backends.checkpoint import load_tokenizer
from neuron_ssp.backends.neuron.api import NEURON_INDEX
from neuron_ssp.backends.window_check import (
    MIN_PAST_EDGE,
    WindowJudgement,
    judge_windows,
    passage_ids,
    score_both_ways,
)
from neuron_ssp.config import Config
from neuron_ssp.embedded.models import resolve_model_path
from neuron_ssp.errors import Problem, RuntimeProblem
from neuron_ssp.topology.networks import context_buckets

PROMPT_TOKENS = 8
PASSAGE = "the Gettysburg Address"
FIXED_IDS = "fixed token ids (no tokenizer in the model directory)"
NXDI = "neuronx-distributed-inference"  # the label NxDI loads pass as library_version


def bucket_edge(n_positions: int) -> int:
    """Where 0623de2's capping starts: its window's `estimate`, the smallest context bucket (64 from
    n_positions 128 on)."""
    return context_buckets(n_positions)[0]


def self_test_length(n_positions: int, k: int) -> int:
    """Tokens the self-test scores: up to MIN_PAST_EDGE positions past the edge, within the cache."""
    return min(n_positions, bucket_edge(n_positions) + MIN_PAST_EDGE + k)


def self_test_tokens(model_dir: Path, vocab_size: int, length: int) -> tuple[torch.Tensor, str]:
    """(ids, what they are): the passage through the model's own tokenizer; fixed ids where it has none."""
    tokenizer = load_tokenizer(model_dir)
    if tokenizer is None:
        low = min(3, vocab_size - 1)  # avoid the lowest ids, often special tokens
        return low + (torch.arange(length, dtype=torch.long) * 7919) % (vocab_size - low), FIXED_IDS
    return passage_ids(tokenizer, length), PASSAGE


@dataclass(frozen=True)
class SelfTestResult:
    library_version: str
    text: str  # what was scored
    judgement: WindowJudgement

    def to_dict(self) -> dict[str, Any]:
        return {"library_version": self.library_version, "text": self.text, **self.judgement.to_dict()}


def library_label(version: str) -> str:
    """'neuronx-distributed-inference 0.9.0' as given; a bare version is transformers-neuronx's."""
    return version if version.startswith(NXDI) else f"transformers-neuronx {version}"


def static_batch_self_test_skip(config: Config) -> str | None:
    """Why the self-test cannot run on this load, or None. Models the library's loops (engine library / fused)
    run at a static batch B > 1 are compiled for B rows only: their context networks at batch B (llama/model.py:82-84,
    :249-257 at 1ade6d7: `context_batch_sizes` is `batch_sizes` without continuous batching) and the target's
    windows at (k, B) (base.py:129-132), while the self-test scores one row through `NeuronBackend` ((1, n)
    inputs, 1-D cache_ids). Skipped, not emulated: the skip says what goes unchecked and how to check it."""
    engine, batch = config.speculation.engine, config.target.batch_size
    if engine == "native" or batch == 1:
        return None
    return (
        f"Neuron self-test skipped: engine {engine} at target.batch_size {batch} runs models compiled for a "
        f"static batch of {batch} rows, which the one-row self-test cannot score; NOT checked: whether this "
        f"transformers-neuronx build's k={config.speculation.k} window scores as one-token decoding does. Check "
        "the build with the same config at target.batch_size: 1 and draft.batch_size: 1 (neuron-ssp doctor "
        "--self-test), or with speculation.engine: native at this batch"
    )


def self_test(
    target: ModelBackend, config: Config, library_version: str, model_dir: Path | None = None
) -> SelfTestResult:
    """The loaded target's k-wide window against one-token calls, on a passage in its own tokenizer (from the
    target's directory, `model_dir`: the loader's, or resolved here)."""
    k = getattr(target, "speculation_length", None)
    assert k, "the self-test needs the speculation-enabled target"
    model_dir = model_dir or resolve_model_path(config.target.path, "target.path")
    tokens, text = self_test_tokens(model_dir, target.vocab_size, self_test_length(target.n_positions, k))
    return run_self_test(target, tokens, library_version, text, config.neuron.self_test_min_agreement)


@torch.inference_mode()
def run_self_test(
    target: ModelBackend, tokens: torch.Tensor, library_version: str, text: str, min_agreement: float
) -> SelfTestResult:
    """Score `tokens` both ways from slot PROMPT_TOKENS on and judge the regions before and from the edge."""
    k = getattr(target, "speculation_length", None)
    if not k:
        raise ValueError("the self-test needs a speculation-enabled target")
    scores = score_both_ways(target, tokens[: self_test_length(target.n_positions, k)], k, PROMPT_TOKENS)
    judgement = judge_windows(scores, k, bucket_edge(target.n_positions), min_agreement)
    return SelfTestResult(library_version, text, judgement)


def check_self_test(result: SelfTestResult) -> None:
    """RuntimeProblem when the window fails; a warning when it passes but is not exact or not complete."""
    judgement = result.judgement
    if not judgement.rows:
        warnings.warn(
            f"Neuron self-test skipped: n_positions leaves no room for a k={judgement.k} window after "
            f"the {PROMPT_TOKENS}-token prompt",
            stacklevel=2,
        )
        return
    if not judgement.passed:
        raise RuntimeProblem(
            Problem(
                "neuron.self_test",
                "; ".join(judgement.failures),
                f"{library_label(result.library_version)}: the k={judgement.k} window scores {result.text} "
                f"differently from one-token calls at the same cache positions ({judgement.summary()})",
                _cause(result),
            )
        )
    notes = []
    if judgement.short_of_edge:
        notes.append(
            f"only {judgement.past.positions} positions from slot {judgement.edge} fit in n_positions "
            f"(the test judges {MIN_PAST_EDGE} where there is room)"
        )
    if result.text == FIXED_IDS:
        notes.append("it scored fixed ids, not text: add the tokenizer to the model directory for a sharper test")
    if not judgement.exact:
        notes.append(
            "the k-wide and one-token graphs are not bit-identical (bf16 on a device), so greedy "
            "speculative output equals plain greedy output only up to such near-ties"
        )
    if notes:
        warnings.warn(f"Neuron self-test passed ({judgement.summary()}); " + "; ".join(notes), stacklevel=2)


def _cause(result: SelfTestResult) -> str:
    judgement = result.judgement
    if result.library_version.startswith(NXDI):
        return (
            "reinstall neuronx-distributed-inference from the Neuron repository and recompile "
            "(neuron-ssp compile --force); every engine on this target scores through the same "
            "speculation model, so report the versions if it persists"
        )
    if any(failure.startswith(judgement.past.name) for failure in judgement.failures):
        return (
            "windows from the first context bucket on disagree: the cache_ids capping of "
            "transformers-neuronx snapshot 0623de2 (April 2024). Install another build: pip install -U "
            f"'transformers-neuronx<0.14' --extra-index-url={NEURON_INDEX} (on a DLAMI: the SDK 2.24-2.25 "
            "venv ships a later one)"
        )
    return (
        "reinstall transformers-neuronx from the Neuron repository, recompile (neuron-ssp compile --force), "
        "and report the versions if it persists; speculation.engine: native with policy fixed cannot "
        "help, as it uses the same window"
    )
