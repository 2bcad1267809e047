"""`engine: fused` at batch > 1 with continuous batching: transformers-neuronx's FusedSpeculativeDecoder driven
through its continuous-batching entry, `speculative_iteration` (fused_speculation.py:746-867 at 1ade6d7, ported in
the stand-in): a prompt joins a running batch with a context encoding of its own cache line, each step is one
iteration of the fused graph over the running rows, and every row's output is its output at batch 1."""

from __future__ import annotations

import functools
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from neuron_support import neuron_config, prompt, with_tokenizer

from neuron_ssp.config import Config
from neuron_ssp.engines.rows import RowCallbacks
from neuron_ssp.pipeline.load import load_pipeline

pytest_plugins = ["neuron_fixtures"]  # fixtures: neuronx, near_draft, tiny_model_dirs
K = 4
CASES = [(prompt(5, seed=1), 20), (prompt(13, seed=2), 9), (prompt(9, seed=3), 30), (prompt(1, seed=4), 12)]


def fused_config(dirs: dict[str, Path], target: Path, batch: int, acceptor: str = "greedy", **sections: Any) -> Config:
    sizes = {"batch_size": batch}
    return neuron_config(
        target,
        dirs["draft"],
        speculation={"engine": "fused", "k": K, "acceptor": acceptor},
        target=sizes,
        draft=sizes,
        generation={"chat_template": False},
        **sections,
    )


def alone(dirs: dict[str, Path], target: Path) -> list[Any]:
    """Each case at batch 1, through FusedSpeculativeDecoder.sample as before batching existed."""
    pipeline = load_pipeline(fused_config(dirs, target, 1))
    return [pipeline.generator.generate(ids, new, pipeline.eos_token_ids) for ids, new in CASES]


def test_rows_join_a_running_batch_and_each_is_its_batch_1_output(
    neuronx: ModuleType, near_draft: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers_neuronx import fused_speculation

    target = with_tokenizer(near_draft["target"], tmp_path)
    expected = alone(near_draft, target)
    calls: list[tuple[list[list[int]], list[list[int]], list[int]]] = []
    real = fused_speculation.FusedSpeculativeDecoder.speculative_iteration

    @functools.wraps(real)
    def spy(self, input_ids, cache_ids, start_ids):
        calls.append((input_ids.tolist(), cache_ids.tolist(), start_ids.tolist()))
        return real(self, input_ids, cache_ids, start_ids)

    monkeypatch.setattr(fused_speculation.FusedSpeculativeDecoder, "speculative_iteration", spy)
    neuronx.RUNTIME.events.clear()
    pipeline = load_pipeline(fused_config(near_draft, target, 2), max_batch=2)
    for who, call, kwargs in neuronx.RUNTIME.events:
        if call == "from_pretrained":  # both models: one KV cache line per sequence (continuous batching)
            assert kwargs["batch_size"] == 2 and kwargs["neuron_config"].continuous_batching is not None, who
    loop = pipeline.row_loop()
    sampling = pipeline.config.sampling
    pending = list(enumerate(CASES))
    rows: dict[int, Any] = {}

    def join() -> None:
        index, (ids, new) = pending.pop(0)
        rows[index] = loop.join(pipeline.row_request(ids, new, sampling, RowCallbacks()))

    join()
    loop.step()
    assert not rows[0].finished and loop.free_slots == 1  # the first row runs on across iterations
    join()  # the second joins the running batch: its prompt is its own context encoding
    assert calls[-1][1] == [list(range(len(CASES[1][0])))] and calls[-1][2] == [rows[1].slot]
    while loop.rows or pending:
        while pending and loop.free_slots:
            join()
        loop.step()
    for index, result in enumerate(expected):
        row = rows[index]
        assert row.error is None and row.seq.generated() == result.tokens, index
        for name in ("target_calls", "draft_tokens", "accepted_tokens", "accepted_at"):  # its iterations, its alone
            assert getattr(row.stats, name) == getattr(result.stats, name), (index, name)
    iterations = [c for c in calls if all(len(ids) == 1 for ids in c[0])]
    assert any(len(c[2]) == 2 for c in iterations)  # two rows in one iteration of the fused graph
    assert all(c[2] == sorted(c[2]) for c in iterations)


def test_the_decoder_pads_with_an_id_no_row_can_produce(
    neuronx: ModuleType, tiny_model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    """speculative_iteration rewrites every token equal to pad_token_id into row 0's first token before it cuts each
    row at its count (fused_speculation.py:220-234 at 1ade6d7): a row that accepted that id (its EOS, when the pad
    is the EOS) would commit another token in its place. The engine pads with the vocabulary size."""
    from transformers_neuronx.fused_speculation import FusedSpeculativeDecoder

    tokens, counts = torch.tensor([[7, 2, 9], [2, 5, 0]]), torch.tensor([[3], [2]])
    rewritten, _ = FusedSpeculativeDecoder.speculative_iteration_post_process(
        type("Decoder", (), {"pad_token_id": 2})(), tokens.clone(), counts
    )
    assert rewritten.tolist() == [[7, 7, 9], [7, 5, 2]]  # both rows' real token 2 became row 0's first token
    target = with_tokenizer(tiny_model_dirs["target"], tmp_path)
    pipeline = load_pipeline(fused_config(tiny_model_dirs, target, 2), max_batch=2)
    assert pipeline.generator.decoder.pad_token_id == pipeline.target.vocab_size


def test_rows_sample_on_the_device_each_to_its_own_end(
    neuronx: ModuleType, tiny_model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    """With do_sample the graph draws per row (hlo.multinomial over the batch, fused_speculation.py:396); the
    settings are the compiled ones and the draws unseeded, so only each row's end is checked: its budget or EOS."""
    target = with_tokenizer(tiny_model_dirs["target"], tmp_path)
    config = fused_config(tiny_model_dirs, target, 2, "probabilistic", sampling={"temperature": 0.8, "top_k": 20})
    with pytest.warns(UserWarning, match="samples on device"):
        pipeline = load_pipeline(config, max_batch=2)
    loop = pipeline.row_loop()
    rows = [loop.join(pipeline.row_request(ids, new, config.sampling, RowCallbacks())) for ids, new in CASES[:2]]
    while loop.rows:
        loop.step()
    for row, (_, new) in zip(rows, CASES[:2], strict=True):
        tokens = row.seq.generated()
        assert row.error is None and (len(tokens) == new or tokens[-1] in pipeline.eos_token_ids)
