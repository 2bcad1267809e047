"""EAGLE heads on NxD Inference's real code (CPU mode): an EAGLE-3 head prepared by `neuron-ssp prepare-draft`
(and an EAGLE-1 head) fused with a tiny target, at batch 1 and with rows joining and leaving a batch of 2 and 4;
every row's greedy output equals the target's own greedy decoding (Hugging Face) and its batch-1 output.

The target has 8 layers: NxDI hands an EAGLE-3 head the outputs of layers 1, N/2-1 and N-4 (model_base.py:1402-1405),
three distinct layers from N = 7 on. Runs in .venv-nxdi (`bash .ci/nxdi.sh`); skips elsewhere with the reason.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from eagle_support import tiny_head
from neuron_support import VOCAB, prompt, save_tiny_llama
from nxdi_support.configs import nxdi_config
from nxdi_support.recording import recorded_forward
from safetensors.torch import load_file, save_file
from test_nxdi_batching import cut, serve
from transformers import LlamaForCausalLM

from neuron_ssp.drafters.eagle_checkpoint import write_checkpoint
from neuron_ssp.engines.nxdi_fused import GREEDY, NxdiFusedEngine, NxdiFusedLoop
from neuron_ssp.engines.rows import RowRequest, RowSettings
from neuron_ssp.tools.prepare_draft import prepare_draft
from neuron_ssp.topology import plan_deployment, validate_config

pytest_plugins = ["nxdi_fixtures"]

K = 4
REQUESTS = [(5, 1, 16), (9, 2, 6), (12, 3, 12), (7, 4, 1), (10, 5, 14), (6, 6, 9), (8, 7, 11)]


@pytest.fixture(scope="module")
def eagle_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny 8-layer target, its EAGLE-3 head over a 40-token draft vocabulary prepared for NxDI, an EAGLE-1 head."""
    root = tmp_path_factory.mktemp("eagle")
    save_tiny_llama(root / "target", seed=0, layers=8)
    write_checkpoint(tiny_head(VOCAB, draft_vocab_size=40, taps=(2, 4, 5), seed=5), root / "eagle3-head")
    prepare_draft(root / "eagle3-head", root / "target", root / "eagle3-nxdi")
    return {
        "target": root / "target",
        "eagle3": root / "eagle3-nxdi",
        "eagle": eagle1_head(root),
        **agreeing_pair(root),
    }


def agreeing_pair(root: Path) -> dict[str, Path]:
    """A target and a head whose final norms are zero: every logit 0, so both always choose token 0 and every draft
    is accepted. The tokens prove nothing; the path does: k tokens per call, positions and the rolling buffer of
    hidden states advancing by k, rows at different positions in one call."""
    save_tiny_llama(root / "flat-target", seed=0, layers=8)
    weights = root / "flat-target" / "model.safetensors"
    tensors = load_file(str(weights))
    tensors["model.norm.weight"] = torch.zeros_like(tensors["model.norm.weight"])
    save_file(tensors, str(weights))
    head = tiny_head(VOCAB, draft_vocab_size=VOCAB, taps=(2, 4, 5), seed=6)
    head.tensors["norm.weight"] = torch.zeros_like(head.tensors["norm.weight"])
    write_checkpoint(head, root / "flat-head")
    prepare_draft(root / "flat-head", root / "flat-target", root / "flat-nxdi")
    return {"flat-target": root / "flat-target", "flat": root / "flat-nxdi"}


def eagle1_head(root: Path) -> Path:
    """An EAGLE-1 head as NxDI loads it (feature-guide.rst:644-662): one Llama layer, fc over [embedding; hidden]
    (2H), the target's lm_head and embedding."""
    save_tiny_llama(root / "eagle1", seed=9, layers=1)
    tensors = load_file(str(root / "eagle1" / "model.safetensors"))
    target = load_file(str(root / "target" / "model.safetensors"))
    tensors["model.embed_tokens.weight"] = target["model.embed_tokens.weight"]
    tensors["lm_head.weight"] = target["lm_head.weight"]
    tensors["model.fc.weight"] = 0.1 * torch.randn(32, 64)  # H x 2H
    save_file({name: t.contiguous() for name, t in tensors.items()}, str(root / "eagle1" / "model.safetensors"))
    return root / "eagle1"


def eagle_config(dirs: dict[str, Path], drafter: str, batch: int, head: str | None = None) -> Any:
    batches = {"batch_size": batch}
    return nxdi_config(
        dirs["flat-target" if head == "flat" else "target"],
        dirs[head or drafter],
        target=batches,
        draft=batches,
        speculation={"engine": "fused", "acceptor": "greedy", "k": K, "drafter": drafter},
        neuron={"self_test": False, "nxdi": {"sequence_parallel_enabled": drafter == "eagle3"}},
    )


def eagle_target(dirs: dict[str, Path], drafter: str, batch: int, head: str | None = None) -> Any:
    from neuron_ssp.backends.nxdi.load import load_nxdi_fused

    config = eagle_config(dirs, drafter, batch, head)
    assert validate_config(config).errors == []
    return load_nxdi_fused(config, plan_deployment(config))[0]


def hf_greedy(target_dir: Path, ids: torch.Tensor, n: int) -> list[int]:
    model = LlamaForCausalLM.from_pretrained(target_dir).eval()
    out = model.generate(ids.view(1, -1), max_new_tokens=n, do_sample=False, pad_token_id=0, eos_token_id=None)
    return out[0, ids.shape[0] :].tolist()


@pytest.mark.parametrize("drafter", ["eagle3", "eagle"])
def test_an_eagle_head_decodes_the_targets_greedy_tokens_at_batch_1(
    nxdi: Any, eagle_dirs: dict[str, Path], drafter: str
) -> None:
    target = eagle_target(eagle_dirs, drafter, 1)
    built = target.model.neuron_config
    head = target.model.config.fused_spec_config.draft_config.neuron_config
    assert (built.enable_eagle_speculation, built.is_eagle3, head.is_eagle_draft) == (True, drafter == "eagle3", True)
    assert (head.speculation_length, head.enable_eagle_draft_input_norm) == (K, drafter == "eagle3")
    engine = NxdiFusedEngine(target, K)
    for length, seed, _ in REQUESTS[:3]:
        ids = prompt(length, seed)
        result = engine.generate(ids, 16)
        assert result.tokens == hf_greedy(eagle_dirs["target"], ids, 16)
        assert result.stats.draft_tokens == (K - 1) * result.stats.target_calls


@pytest.mark.parametrize("batch", [2, 4])
def test_eagle3_rows_joining_and_leaving_decode_as_each_would_alone(
    nxdi: Any, eagle_dirs: dict[str, Path], batch: int
) -> None:
    prompts = [prompt(length, seed) for length, seed, _ in REQUESTS]
    alone = NxdiFusedEngine(eagle_target(eagle_dirs, "eagle3", 1), K)
    full = [alone.generate(ids, 16).tokens for ids in prompts]
    expected = [cut(full[i], budget, set()) for i, (_, _, budget) in enumerate(REQUESTS)]

    target = eagle_target(eagle_dirs, "eagle3", batch)
    calls = recorded_forward(target.model)
    loop = NxdiFusedLoop(target, K)
    requests = [
        RowRequest(ids, budget, settings=RowSettings(GREEDY))
        for ids, (_, _, budget) in zip(prompts, REQUESTS, strict=True)
    ]
    rows, joined_at, running = serve(loop, requests)

    assert [row.result().tokens for row in rows] == expected
    assert max(running) == batch and min(running) < batch and any(step > 0 for step in joined_at)
    assert loop.free_slots == batch
    assert {len(c["seq_ids"]) for c in calls if c["position_ids"][0][0] == 0} == {1}  # prompts one at a time


@pytest.mark.parametrize("batch", [1, 2])
def test_accepted_drafts_advance_k_tokens_per_call(nxdi: Any, eagle_dirs: dict[str, Path], batch: int) -> None:
    loop = NxdiFusedLoop(eagle_target(eagle_dirs, "eagle3", batch, "flat"), K)
    requests = [
        RowRequest(prompt(length, seed), budget, settings=RowSettings(GREEDY)) for length, seed, budget in REQUESTS[:3]
    ]
    rows, _, _ = serve(loop, requests)
    for row, (_, _, budget) in zip(rows, REQUESTS[:3], strict=True):
        assert row.result().tokens == [0] * budget
        calls = -(-(budget - 1) // K)  # the prefill's token, then K a call
        last = budget - 1 - K * (calls - 1)  # what the budget leaves of the last call's K
        accepted = (K - 1) * (calls - 1) + min(K - 1, last)  # every draft the budget kept
        assert (row.stats.target_calls, row.stats.accepted_tokens) == (calls, accepted)


def test_compile_builds_the_eagle_graph_once_with_the_head_inside(
    nxdi: Any, eagle_dirs: dict[str, Path], tmp_path: Path
) -> None:
    """`neuron-ssp compile` of an EAGLE-3 config: one fused target job whose NxDI config carries the EAGLE switches
    and the head's, kept under our manifest and reused the second time."""
    import json

    import yaml
    from click.testing import CliRunner

    from neuron_ssp.cli import main

    path = tmp_path / "eagle.yaml"
    path.write_text(yaml.safe_dump(eagle_config(eagle_dirs, "eagle3", 2).model_dump(mode="json")))
    out = tmp_path / "compiled"
    result = CliRunner().invoke(main, ["compile", str(path), "--k", str(K), "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output[result.output.index("{\n") :])
    assert [(r["role"], r["k"], r["reused"]) for r in report["results"]] == [("target", [K], False)]
    (saved,) = out.rglob("neuron_config.json")
    built = json.loads(saved.read_text())["neuron_config"]
    assert (built["enable_eagle_speculation"], built["is_eagle3"], built["sequence_parallel_enabled"]) == (
        True,
        True,
        True,
    )
    again = CliRunner().invoke(main, ["compile", str(path), "--k", str(K), "--out", str(out), "--json"])
    assert json.loads(again.output[again.output.index("{\n") :])["results"][0]["reused"]
