"""Before the first request: does the k-wide scoring window agree with one-token decoding?

The speculative loop trusts `speculative_forward` to score k tokens exactly as k one-token `forward`
calls at the same cache positions would. A library build that gets this wrong produces fluent
garbage with no error: the snapshot 0623de2 (April 2024, inside 0.10.x) pads a window's cache_ids to
the smallest prompt bucket and caps them at 63, so every window at position >= 64 reads and writes
the wrong slots. So after load we score a fixed token sequence both ways, window by window, from
the start of the cache to past position 64 (the bucket edge), and compare the logits per position.

Both ways write the same tokens to the same slots, so the cache state is the same whichever runs
last; the test leaves the cache stale, which is the state every generation starts from anyway.
bf16 graphs are not bit-identical between the two networks: near-ties may flip an argmax, which is
why exact agreement is not required (a warning says so) but a low one fails the load.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from neuron_ssp.backends.neuron.api import NEURON_INDEX
from neuron_ssp.backends.neuron.scoring import NeuronBackend
from neuron_ssp.errors import Problem, RuntimeProblem

BUCKET_EDGE = 64  # 0623de2 caps window cache_ids at the smallest prompt bucket (64) - 1
PROMPT_TOKENS = 8
PAST_EDGE = 8  # windows continue this far past the edge
NXDI = "neuronx-distributed-inference"  # the label NxDI loads pass as library_version


@dataclass(frozen=True)
class PositionCheck:
    position: int  # cache slot
    max_abs_diff: float  # max |window logit - one-token logit| over the vocabulary
    argmax_agrees: bool


@dataclass(frozen=True)
class SelfTestResult:
    k: int
    library_version: str
    positions: list[PositionCheck]

    def agreement(self, low: int = 0, high: int | None = None) -> float | None:
        rows = [p for p in self.positions if p.position >= low and (high is None or p.position < high)]
        return sum(p.argmax_agrees for p in rows) / len(rows) if rows else None

    @property
    def max_abs_diff(self) -> float:
        return max((p.max_abs_diff for p in self.positions), default=0.0)

    def to_dict(self) -> dict[str, object]:
        return {
            "k": self.k,
            "library_version": self.library_version,
            "argmax_agreement": self.agreement(),
            "argmax_agreement_below_64": self.agreement(0, BUCKET_EDGE),
            "argmax_agreement_from_64": self.agreement(BUCKET_EDGE),
            "max_abs_logit_diff": self.max_abs_diff,
            "positions": [p.__dict__ for p in self.positions],
        }


def fixed_tokens(vocab_size: int, length: int) -> torch.Tensor:
    """A deterministic token sequence that avoids the lowest ids (often special tokens)."""
    low = min(3, vocab_size - 1)
    return low + (torch.arange(length, dtype=torch.long) * 7919) % (vocab_size - low)


@torch.inference_mode()
def run_self_test(target: NeuronBackend, library_version: str) -> SelfTestResult:
    """Score windows of width k two ways from slot PROMPT_TOKENS to past slot 64 (or the cache's end)."""
    k = target.speculation_length
    if not k:
        raise ValueError("the self-test needs a speculation-enabled target")
    end = min(target.n_positions, BUCKET_EDGE + PAST_EDGE + k)
    tokens = fixed_tokens(target.vocab_size, end)
    target.prefill(tokens[:PROMPT_TOKENS])
    checks: list[PositionCheck] = []
    for start in range(PROMPT_TOKENS, end - k + 1, k):
        window = target.score(tokens[start : start + k], start)  # one speculative_forward call
        single = torch.cat([target.score(tokens[start + i : start + i + 1], start + i) for i in range(k)])
        for i in range(k):
            diff = float((window[i] - single[i]).abs().max())
            agrees = int(window[i].argmax()) == int(single[i].argmax())
            checks.append(PositionCheck(start + i, diff, agrees))
    return SelfTestResult(k, library_version, checks)


def check_self_test(result: SelfTestResult, min_agreement: float) -> None:
    """RuntimeProblem below `min_agreement`; a warning when agreement is high but not exact."""
    if not result.positions:
        warnings.warn(f"Neuron self-test skipped: n_positions leaves no room for a k={result.k} window after "
                      f"the {PROMPT_TOKENS}-token prompt", stacklevel=2)
        return
    overall = result.agreement() or 0.0
    below, above = result.agreement(0, BUCKET_EDGE), result.agreement(BUCKET_EDGE)
    where = f"below slot 64: {_percent(below)}, from slot 64: {_percent(above)}"
    label = library_label(result.library_version)
    if overall < min_agreement:
        capped = below is not None and above is not None and below >= min_agreement > above
        nxdi_cause = ("reinstall neuronx-distributed-inference from the Neuron repository and recompile "
                      "(neuron-ssp compile --force); every engine on this target scores through the same "
                      "speculation model, so report the versions if it persists")
        cause = nxdi_cause if label.startswith(NXDI) else (
            "windows at cache positions >= 64 disagree: the cache_ids capping of transformers-neuronx "
            "snapshot 0623de2 (April 2024). Install another build: pip install -U 'transformers-neuronx<0.14' "
            f"--extra-index-url={NEURON_INDEX} (on a DLAMI: the SDK 2.24-2.25 venv ships a later one)"
            if capped
            else "reinstall transformers-neuronx from the Neuron repository, recompile (neuron-ssp compile --force), "
            "and report the versions if it persists; speculation.engine: native with policy fixed cannot "
            "help, as it uses the same window"
        )
        raise RuntimeProblem(
            Problem(
                "neuron.self_test",
                f"argmax agreement {overall:.0%} < {min_agreement:.0%}",
                f"{label}: the k={result.k} window scores differently from one-token calls at the same cache "
                f"positions ({where}; "
                f"max |logit diff| {result.max_abs_diff:.3g})",
                cause,
            )
        )
    if overall < 1.0:
        warnings.warn(
            f"Neuron self-test: argmax agreement {overall:.1%} ({where}, max |logit diff| "
            f"{result.max_abs_diff:.3g}) between the k={result.k} window and one-token calls. bf16 graphs "
            "are not bit-identical, so greedy speculative output equals plain greedy output only up to "
            "such near-ties",
            stacklevel=2,
        )


def library_label(version: str) -> str:
    """'neuronx-distributed-inference 0.9.0' as given; a bare version is transformers-neuronx's."""
    return version if version.startswith(NXDI) else f"transformers-neuronx {version}"


def _percent(value: float | None) -> str:
    return "not reached" if value is None else f"{value:.0%}"
