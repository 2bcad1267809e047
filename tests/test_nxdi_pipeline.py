"""The user's path on NxD Inference, on the real NxDI code (CPU mode): config -> load_pipeline -> text for the
native engine and for NxDI's fused speculation, tune-k loading one target per k, the self-test on NxDI.

Runs in .venv-nxdi (`bash .ci/nxdi.sh`); skips elsewhere with the reason (tests/nxdi_fixtures.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from neuron_support import with_tokenizer
from nxdi_support.configs import nxdi_config
from transformers import LlamaForCausalLM

from neuron_ssp.errors import RuntimeProblem
from neuron_ssp.pipeline.load import load_pipeline

pytest_plugins = ["neuron_fixtures", "nxdi_fixtures"]  # tiny_model_dirs; nxdi

TEXT = "w5 w9 w11 w5 w9 w40 w41"


def hf_greedy(model_dir: Path, ids: torch.Tensor, n: int, eos: int | None = None) -> list[int]:
    """Hugging Face's model on the same checkpoint, argmax token by token: n tokens, or up to `eos`."""
    model = LlamaForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    tokens = ids.tolist()
    with torch.inference_mode():
        while len(tokens) < ids.shape[0] + n and (eos is None or tokens[-1] != eos or len(tokens) == ids.shape[0]):
            tokens.append(int(model(input_ids=torch.tensor([tokens])).logits[0, -1].argmax()))
    return tokens[ids.shape[0] :]


def test_native_engine_through_the_pipeline_equals_plain_greedy(nxdi: Any, tiny_model_dirs, tmp_path) -> None:
    target = with_tokenizer(tiny_model_dirs["target"], tmp_path)
    pipeline = load_pipeline(nxdi_config(target, tiny_model_dirs["draft"], generation={"chat_template": False}))
    assert type(pipeline.target).__name__ == "NxdiBackend"
    ssp = pipeline.speculative(TEXT)
    assert ssp.tokens == pipeline.plain(TEXT).tokens
    assert ssp.tokens == hf_greedy(target, pipeline.encode(TEXT), len(ssp.tokens), eos=2)
    assert ssp.result.stats.target_calls > 0


@pytest.mark.parametrize("draft_role", ["draft", "target"])
def test_fused_speculation_runs_nxdis_graph_and_equals_plain_greedy(
    nxdi: Any, tiny_model_dirs, tmp_path, draft_role: str
) -> None:
    """NxDI's NeuronFusedSpecModel on CPU: a different draft accepts little, the target as its own draft all."""
    target = with_tokenizer(tiny_model_dirs["target"], tmp_path)
    config = nxdi_config(
        target,
        tiny_model_dirs[draft_role],
        generation={"chat_template": False},
        speculation={"engine": "fused", "acceptor": "greedy"},
    )
    from nxdi_support import stubs

    fused = load_pipeline(config)
    assert type(fused.generator).__name__ == "NxdiFusedEngine"
    stubs.CALLS.clear()
    streamed: list[list[int]] = []
    ids = fused.encode(TEXT)
    result = fused.generator.generate(ids, 24, on_tokens=streamed.append)
    assert result.tokens == hf_greedy(target, ids, 24)
    # nothing closed-source ran but the platform name and the greedy Argmax op (stood in by torch.argmax)
    assert set(stubs.CALLS) <= {"torch_neuronx.get_platform_target", "torch_neuronx.Argmax.apply"}
    assert stubs.CALLS["torch_neuronx.Argmax.apply"] > 0
    assert sum(streamed, []) == result.tokens and len(streamed) > 1  # streamed per call
    stats = result.stats
    assert stats.target_calls > 0 and stats.draft_tokens == 3 * stats.target_calls
    if draft_role == "target":
        assert stats.acceptance_rate == 1.0 and max(len(s) for s in streamed) == 4  # k = 4 tokens per call
    with pytest.raises(RuntimeProblem, match="engine: native"):
        fused.plain(TEXT)


def test_tune_k_loads_one_nxdi_target_per_k_and_prices_padded_windows(nxdi: Any, tiny_model_dirs, tmp_path) -> None:
    from neuron_ssp.tools.per_k import compiled_target_groups
    from neuron_ssp.tools.prompt_set import BenchPrompt
    from neuron_ssp.tools.tune_k import tune_k

    target = with_tokenizer(tiny_model_dirs["target"], tmp_path)
    config = nxdi_config(
        target,
        tiny_model_dirs["draft"],
        generation={"chat_template": False, "max_new_tokens": 8},
        neuron={"compiled_dir": str(tmp_path / "compiled"), "self_test": False},
    )
    result = tune_k(compiled_target_groups(config, [2, 3]), [BenchPrompt("copy", TEXT)], 8)
    assert [row.k for row in result.rows] == [2, 3]
    compiled = [name for name, call, _ in nxdi.DEVICE_CALLS if call == "compile"]
    assert compiled.count(target.name) == 2  # one target per k
    assert all(row.setup.note.startswith(f"NxD Inference target for k={row.k}") for row in result.rows)
    assert all(row.speedup_width_model > 0 for row in result.rows)
    assert set(result.width_cost.ms) == {1, 2, 3}  # each k timed on its own target, not k=2's for every row


def test_self_test_runs_on_nxdi_before_serving(nxdi: Any, tiny_model_dirs: dict[str, Path]) -> None:
    """The k-wide speculation call against one-token (padded) calls at the same slots, past slot 64."""
    from neuron_ssp.backends.neuron.selftest import self_test
    from neuron_ssp.backends.nxdi.load import load_nxdi_backends
    from neuron_ssp.topology import plan_deployment

    config = nxdi_config(tiny_model_dirs["target"])
    target, _ = load_nxdi_backends(config, plan_deployment(config))  # the load-time self-test passed
    judgement = self_test(target, config, "neuronx-distributed-inference 0.9.0").judgement
    assert judgement.passed and judgement.before.argmax_agreement == judgement.past.argmax_agreement == 1.0
    assert max(row.relative_diff for row in judgement.rows) < 1e-4 and judgement.past.positions >= 32


def test_a_window_that_scores_differently_fails_the_nxdi_self_test(nxdi: Any, tiny_model_dirs: dict[str, Path]) -> None:
    """A speculation model whose multi-token windows from slot 64 on lose the cache (they see slot 0 and
    themselves: a wrong attention mask, imitated on the NxDI call) must fail the load with the NxDI fix."""
    from neuron_ssp.backends.nxdi import scoring
    from neuron_ssp.backends.nxdi.load import load_nxdi_backends
    from neuron_ssp.topology import plan_deployment

    real = scoring.NxdiBackend._forward

    def capped(self: Any, input_ids: torch.Tensor, position_ids: torch.Tensor, committed: int) -> torch.Tensor:
        if len(set(input_ids[0].tolist())) > 1 and committed >= 64:  # a real window, not a padded single token
            return real(self, input_ids, position_ids - committed + 1, 1)  # sees slot 0 and itself only
        return real(self, input_ids, position_ids, committed)

    scoring.NxdiBackend._forward = capped
    try:
        config = nxdi_config(tiny_model_dirs["target"])
        with pytest.raises(RuntimeProblem) as error:
            load_nxdi_backends(config, plan_deployment(config))
    finally:
        scoring.NxdiBackend._forward = real
    (problem,) = error.value.problems
    assert problem.field == "neuron.self_test" and problem.rule.startswith("neuronx-distributed-inference 0.9")
    assert "before slot 64: 56 positions, argmax agreement 100%" in problem.rule
    assert "from slot 64" in str(problem.value)
    assert "neuronx-distributed-inference" in problem.fix


def test_a_fused_target_compiled_for_a_batch_serves_rows_through_the_pipelines_loop(
    nxdi: Any, tiny_model_dirs, tmp_path
) -> None:
    """engine fused on NxDI at batch_size 2: the pipeline batches, its loop is the engine's own (two loops would
    share cache line 0), two requests run at once and each equals its run alone; logprobs are refused."""
    from neuron_ssp.config import SamplingConfig
    from neuron_ssp.engines.rows import RowCallbacks
    from neuron_ssp.errors import UsageError

    target = with_tokenizer(tiny_model_dirs["target"], tmp_path)
    config = nxdi_config(
        target,
        tiny_model_dirs["draft"],
        generation={"chat_template": False},
        speculation={"engine": "fused", "acceptor": "greedy"},
        target={"batch_size": 2},
        draft={"batch_size": 2},
    )
    pipeline = load_pipeline(config)
    assert not pipeline.scores_tokens
    loop = pipeline.row_loop()
    assert loop is pipeline.row_loop() is pipeline.generator.loop and loop.free_slots == 2
    greedy = SamplingConfig(temperature=0.0)
    prompts = [pipeline.encode(TEXT), pipeline.encode("w3 w7 w3 w7 w3")]
    alone = [pipeline.generate_ids(ids, 12, greedy).tokens for ids in prompts]
    rows = [loop.join(pipeline.row_request(ids, 12, greedy, RowCallbacks())) for ids in prompts]
    assert loop.free_slots == 0
    while loop.rows:
        loop.step()
    assert [row.result().tokens for row in rows] == alone
    with pytest.raises(UsageError, match="logprobs"):
        pipeline.generate_ids(prompts[0], 4, greedy, on_logits=lambda rows: None)
