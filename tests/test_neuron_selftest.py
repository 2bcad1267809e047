"""The Neuron self-test: a k-wide window against one-token calls, judged on each side of cache slot 64.

The judging is library-neutral (neuron_ssp.backends.window_check) and is tested on logits built here;
the self-test around it runs on the stand-in, with tiny models (fast) and with the embedded
SmolLM2-135M at k = 2, 5 and 8 (slow), whose confident predictions on real text are what
transformers-neuronx 0623de2's capped cache_ids break.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
import torch
from neuron_support import neuron_config, reimport_standin

from neuron_ssp.backends.neuron.load import load_neuron_backends, self_test
from neuron_ssp.backends.neuron.selftest import FIXED_IDS, SelfTestResult, bucket_edge, check_self_test
from neuron_ssp.backends.window_check import (
    MAX_MEAN_KL,
    MIN_PAST_EDGE,
    WindowScores,
    judge_windows,
    passage_ids,
)
from neuron_ssp.config import EMBEDDED_DEFAULT
from neuron_ssp.errors import RuntimeProblem
from neuron_ssp.topology import plan_deployment

pytest_plugins = ["neuron_fixtures"]  # fixtures: neuronx, neuronx_any, tiny_model_dirs

VOCAB = 50


def confident_logits(n: int, seed: int = 0) -> torch.Tensor:
    """Logits of a confident model: one clear favourite per position."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, VOCAB, generator=gen)
    logits[torch.arange(n), torch.randint(0, VOCAB, (n,), generator=gen)] += 8.0
    return logits


def wrong(logits: torch.Tensor) -> torch.Tensor:
    """The same confidence on another token: what a window reading the wrong cache slot returns."""
    return logits.roll(1, dims=-1)


def scores(windowed: torch.Tensor, one_token: torch.Tensor, first: int = 8) -> WindowScores:
    return WindowScores(list(range(first, first + len(one_token))), one_token, windowed)


def test_a_broken_region_past_the_edge_fails_even_when_overall_agreement_is_high() -> None:
    # 56 exact positions before slot 64 and 10 after, 4 of them wrong: 62/66 = 94 % overall, which the
    # old single threshold of 90 % passed with a warning
    one_token = confident_logits(66)
    windowed = one_token.clone()
    rows = [56, 59, 62, 65]
    windowed[rows] = wrong(one_token[rows])
    judgement = judge_windows(scores(windowed, one_token), 4, 64, 0.9)
    assert not judgement.passed
    assert judgement.before.argmax_agreement == 1.0 and judgement.past.argmax_agreement == 0.6
    assert any(f.startswith("from slot 64: argmax agreement 60%") for f in judgement.failures)


def test_a_wrong_distribution_fails_even_where_every_argmax_agrees() -> None:
    one_token = confident_logits(100)
    windowed = one_token * 0.2  # same argmax everywhere, a much flatter distribution
    judgement = judge_windows(scores(windowed, one_token), 5, 64, 0.9)
    assert judgement.before.argmax_agreement == judgement.past.argmax_agreement == 1.0
    assert not judgement.passed
    assert all(r.mean_kl is not None and r.mean_kl > MAX_MEAN_KL for r in (judgement.before, judgement.past))
    assert any("mean KL" in f for f in judgement.failures)


def test_the_region_from_the_edge_is_judged_against_the_region_before_it() -> None:
    one_token = confident_logits(96)
    windowed = one_token.clone()

    def flip_near_ties(positions: list[int]) -> None:
        """Two candidates 0.02 apart, swapped by the window: the argmax differs, the distribution barely."""
        for row in (p - 8 for p in positions):
            top = int(one_token[row].argmax())
            one_token[row, (top + 1) % VOCAB] = windowed[row, top] = one_token[row, top] - 0.02
            windowed[row, (top + 1) % VOCAB] = one_token[row, top]

    flip_near_ties([64, 73, 82, 91])  # 4 of 40 from slot 64: 90 %
    judgement = judge_windows(scores(windowed, one_token), 4, 64, 0.85)
    assert judgement.past.argmax_agreement == 0.9 and judgement.past.mean_kl < 0.01
    assert judgement.passed  # a 10-point drop is allowed
    flip_near_ties([66, 70])
    judgement = judge_windows(scores(windowed, one_token), 4, 64, 0.8)
    assert judgement.past.argmax_agreement == 0.85 >= 0.8
    assert judgement.failures == [
        "from slot 64: argmax agreement 15% below the 100% before slot 64 (at most 10% allowed)"
    ]


def test_bf16_sized_noise_passes_with_a_warning_about_near_ties() -> None:
    one_token = confident_logits(100)
    windowed = one_token + 0.02 * torch.randn(one_token.shape, generator=torch.Generator().manual_seed(4))
    judgement = judge_windows(scores(windowed, one_token), 4, 64, 0.9)
    assert judgement.passed and not judgement.exact
    with pytest.warns(UserWarning, match="near-ties"):
        check_self_test(SelfTestResult("0.13.322", "the Gettysburg Address", judgement))


def test_the_edge_is_the_smallest_context_bucket() -> None:
    assert bucket_edge(128) == bucket_edge(2048) == 64  # token buckets from 128, context buckets half
    assert bucket_edge(100) == 50  # below 128 the one token bucket is n_positions


def test_the_passage_is_repeated_to_the_length_asked() -> None:
    class Letters:
        def __call__(self, text: str) -> dict[str, list[int]]:
            return {"input_ids": [ord(c) % 50 for c in text[:40]]}

    ids = passage_ids(Letters(), 100)
    assert ids.shape == (100,) and torch.equal(ids[:40], ids[40:80])


def test_passes_on_the_correct_library_with_32_positions_past_64(
    neuronx_any: ModuleType, tiny_model_dirs: dict[str, Path]
) -> None:
    config = neuron_config(tiny_model_dirs["target"], neuron={"self_test": False})
    target, _ = load_neuron_backends(config, plan_deployment(config))
    neuronx_any.RUNTIME.events.clear()
    with pytest.warns(UserWarning, match="scored fixed ids"):  # the tiny models have no tokenizer
        result = self_test(target, config, "0.13.322")
        check_self_test(result)
    judgement = result.judgement
    assert result.text == FIXED_IDS and judgement.passed and judgement.exact
    assert judgement.before.positions > 0 and judgement.past.positions >= MIN_PAST_EDGE
    windows = [d["cache_ids"] for _, c, d in neuronx_any.RUNTIME.events if c == "speculative_forward"]
    singles = [d["cache_ids"] for _, c, d in neuronx_any.RUNTIME.events if c == "forward" and d["cache_ids"]]
    assert all(len(w) == 4 for w in windows) and all(len(s) == 1 for s in singles)
    assert sorted(s[0] for s in singles) == sorted(slot for w in windows for slot in w)  # same slots both ways


def test_the_0623de2_cache_ids_capping_fails_the_load_with_the_fix(
    neuronx: ModuleType, tiny_model_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    reimport_standin(monkeypatch, NEURONX_STANDIN_COMMIT="0623de2")
    config = neuron_config(tiny_model_dirs["target"])
    with pytest.raises(RuntimeProblem) as caught:
        load_neuron_backends(config, plan_deployment(config))
    (problem,) = caught.value.problems
    assert problem.field == "neuron.self_test" and "from slot 64" in str(problem.value)
    assert "0.10.0.360" in problem.rule and "before slot 64: 56 positions, argmax agreement 100%" in problem.rule
    assert "0623de2" in problem.fix and "pip install" in problem.fix


def test_no_room_for_a_window_is_a_warning_not_a_failure() -> None:
    empty = torch.empty(0, 0)
    judgement = judge_windows(WindowScores([], empty, empty), 12, 64, 0.9)
    with pytest.warns(UserWarning, match="skipped"):
        check_self_test(SelfTestResult("0.13.322", "the Gettysburg Address", judgement))


@pytest.mark.slow
@pytest.mark.parametrize("k", [2, 5, 8])
@pytest.mark.parametrize("snapshot", ["", "0623de2"])
def test_the_embedded_model_passes_on_the_correct_library_and_fails_on_0623de2(
    neuronx: ModuleType, use_embedded_cache: str, monkeypatch: pytest.MonkeyPatch, k: int, snapshot: str
) -> None:
    reimport_standin(monkeypatch, NEURONX_STANDIN_COMMIT=snapshot)
    config = neuron_config(Path(EMBEDDED_DEFAULT), speculation={"k": k})
    if not snapshot:
        target, _ = load_neuron_backends(config, plan_deployment(config))  # the self-test passes silently
        assert target.speculation_length == k
        return
    with pytest.raises(RuntimeProblem) as caught:
        load_neuron_backends(config, plan_deployment(config))
    (problem,) = caught.value.problems
    assert "the Gettysburg Address" in problem.rule and "from slot 64" in str(problem.value)
    assert "0623de2" in problem.fix
