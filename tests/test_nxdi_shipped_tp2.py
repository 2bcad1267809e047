"""Every NxDI config we ship, scaled down (tests/nxdi_support/scaled.py), built by our NxDI backend and run by NxDI's
real code at tp = 2 on CPU: two ranks over gloo (tests/nxdi_support/ranks.py), so a sharding mistake shows here
instead of in a trn2 compile. Context encoding and decoding must give the target's own answer: Hugging Face's
greedy tokens (fused engine) or its logits (native engine: the target's k-wide window, the draft's one-token call).

At tp = 1 sharding does nothing, which is how an EAGLE-3 head built without the target's sequence parallelism
passed every other test: at tp = 2 its context encoding joins (B, S, H) embeddings to (B, S/2, H) fused taps
(model_base.py:1592 at 4bcdc54b). Runs in .venv-nxdi (`bash .ci/nxdi.sh`); skips elsewhere with the reason.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from nxdi_fixtures import nxdi_skip_reason
from nxdi_support.scaled import VOCAB, ScaledCase, scaled_case
from transformers import LlamaForCausalLM

CONFIGS = Path(__file__).parents[1] / "configs"
SHIPPED = sorted(path.name for path in CONFIGS.glob("nxdi-*.yaml"))
PROMPT = torch.randint(3, VOCAB, (12,), generator=torch.Generator().manual_seed(7)).tolist()
NEW_TOKENS = 6
DEADLINE_S = 300


@pytest.fixture(scope="module")
def tp2_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, ScaledCase], dict[str, Any]]:
    """Every shipped config scaled and run on two ranks, in one start of the ranks: rank 0's results by name."""
    reason = nxdi_skip_reason()
    if reason:
        pytest.skip(reason)
    from nxdi_support.ranks import run_on_ranks
    from nxdi_support.tp_runs import run_cases

    root = tmp_path_factory.mktemp("shipped-tp2")
    cases = {name: scaled_case(CONFIGS / name, root / name.removesuffix(".yaml")) for name in SHIPPED}
    ranks = run_on_ranks(run_cases, (list(cases.values()), PROMPT, NEW_TOKENS), world=2, deadline_s=DEADLINE_S)
    return cases, ranks[0]


def test_every_nxdi_config_we_ship_is_covered() -> None:
    assert len(SHIPPED) >= 6 and "nxdi-llama31-8b-eagle3-trn2.yaml" in SHIPPED


@pytest.mark.parametrize("name", SHIPPED)
def test_a_shipped_config_runs_at_tp2_and_gives_the_targets_answer(
    tp2_runs: tuple[dict[str, ScaledCase], dict[str, Any]], name: str
) -> None:
    cases, results = tp2_runs
    case, result = cases[name], results[name]
    assert not isinstance(result, str), f"{name} at tp 2 failed:\n{result}"
    assert case.config().target.tp_degree == 2
    target = LlamaForCausalLM.from_pretrained(case.target).eval()
    if "tokens" in result:
        assert result["tokens"] == hf_greedy(target, PROMPT, NEW_TOKENS)
        return
    draft = LlamaForCausalLM.from_pretrained(case.draft).eval()
    k = case.config().speculation.k
    for role, model, width in (("target", target, k), ("draft", draft, 1)):
        window = list(range(3, 3 + width))
        expected = hf_logits(model, PROMPT + window)[len(PROMPT) - 1 :]
        assert torch.allclose(result["logits"][role], expected, atol=1e-4), f"{role} logits differ"


def hf_greedy(model: LlamaForCausalLM, prompt: list[int], n: int) -> list[int]:
    ids = torch.tensor([prompt])
    out = model.generate(ids, max_new_tokens=n, do_sample=False, pad_token_id=0, eos_token_id=None)
    return out[0, len(prompt) :].tolist()


@torch.inference_mode()
def hf_logits(model: LlamaForCausalLM, tokens: list[int]) -> torch.Tensor:
    return model(input_ids=torch.tensor([tokens])).logits[0]
