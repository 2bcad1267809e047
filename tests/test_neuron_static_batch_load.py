"""`engine: library` at batch > 1 from a config: what the loader builds for the library's own batched loop (both
models at batch_size B with NeuronConfig(padding_side='right'), the target's windows at (k, B), no continuous
batching), and the whole path `load_pipeline` -> `row_loop()` through the stand-in, each row's tokens those of its
batch-1 run. (`engine: fused` at batch > 1 batches continuously: tests/test_neuron_fused_rows.py.)"""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from neuron_support import neuron_config, prompt, with_tokenizer

from neuron_ssp.backends.neuron.artifacts import MANIFEST
from neuron_ssp.backends.neuron.compile import compile_models
from neuron_ssp.config import Config
from neuron_ssp.engines.rows import RowCallbacks
from neuron_ssp.pipeline.load import load_pipeline
from neuron_ssp.topology import plan_deployment

pytest_plugins = ["neuron_fixtures"]  # fixtures: neuronx, tiny_model_dirs
K, BATCH = 4, 2
ROWS = [(prompt(5, seed=1), 14), (prompt(11, seed=2), 9)]  # prompt lengths and budgets differ


def config_at(dirs: dict[str, Path], target: Path, engine: str, batch: int, **sections: Any) -> Config:
    sizes = {"batch_size": batch}
    return neuron_config(
        target,
        dirs["draft"],
        speculation={"engine": engine, "k": K},
        target=sizes,
        draft=sizes,
        generation={"chat_template": False},
        **sections,
    )


def built(standin: ModuleType) -> dict[str, dict[str, Any]]:
    """from_pretrained keywords per model directory name."""
    return {who: d for who, call, d in standin.RUNTIME.events if call == "from_pretrained"}


def enabled(standin: ModuleType) -> list[dict[str, Any]]:
    return [d for _, call, d in standin.RUNTIME.events if call == "enable_speculative_decoder"]


def test_a_batch_of_two_rows_from_a_config_gives_each_row_its_batch_1_tokens(
    neuronx: ModuleType, tiny_model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    engine = "library"
    target = with_tokenizer(tiny_model_dirs["target"], tmp_path)
    alone = load_pipeline(config_at(tiny_model_dirs, target, engine, 1))
    expected = [alone.generator.generate(ids, new, alone.eos_token_ids).tokens for ids, new in ROWS]

    neuronx.RUNTIME.events.clear()
    config = config_at(tiny_model_dirs, target, engine, BATCH)
    pipeline = load_pipeline(config)
    for name, kwargs in built(neuronx).items():
        assert kwargs["batch_size"] == BATCH, name
        assert kwargs["neuron_config"].padding_side == "right" and not kwargs["neuron_config"].continuous_batching
    assert set(built(neuronx)) == {target.name, tiny_model_dirs["draft"].name}
    assert enabled(neuronx) == [{"speculation_length": K, "batch_sizes": BATCH}]

    loop = pipeline.row_loop()
    rows = [loop.join(pipeline.row_request(ids, new, config.sampling, RowCallbacks())) for ids, new in ROWS]
    assert loop.free_slots == 0
    finished = loop.step()
    assert {id(row) for row in finished} == {id(row) for row in rows}
    for row, tokens in zip(rows, expected, strict=True):
        assert row.error is None
        assert row.result().tokens == tokens
    calls = [d for _, call, d in neuronx.RUNTIME.events if call in ("speculative_forward", "forward")]
    assert calls and all("executed" in d and len(d["input_ids"]) == BATCH for d in calls)  # 2-D, every row at once


@pytest.mark.parametrize("engine", ["library", "fused"])
def test_batch_1_builds_stay_as_they_were(
    neuronx: ModuleType, tiny_model_dirs: dict[str, Path], tmp_path: Path, engine: str
) -> None:
    """No right padding at batch 1: the models are what they were before batching (left, the library's default)."""
    target = with_tokenizer(tiny_model_dirs["target"], tmp_path)
    load_pipeline(config_at(tiny_model_dirs, target, engine, 1))
    for kwargs in built(neuronx).values():
        assert kwargs["batch_size"] == 1
        neuron = kwargs.get("neuron_config")
        assert neuron is None if engine == "library" else neuron.padding_side == "left"
    assert enabled(neuronx) == ([{"speculation_length": K, "batch_sizes": 1}] if engine == "library" else [])


def test_the_one_row_self_test_is_skipped_at_a_static_batch_and_says_what_goes_unchecked(
    neuronx: ModuleType, tiny_model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    target = with_tokenizer(tiny_model_dirs["target"], tmp_path)
    with pytest.warns(UserWarning, match="self-test skipped: engine library at target.batch_size 2") as caught:
        load_pipeline(config_at(tiny_model_dirs, target, "library", BATCH))
    message = next(str(w.message) for w in caught if "self-test skipped" in str(w.message))
    assert "NOT checked" in message and f"k={K} window" in message and "target.batch_size: 1" in message
    assert "speculative_forward" not in neuronx.RUNTIME.calls()  # the loop alone would call it; nothing ran


def test_compiled_static_batch_models_are_kept_apart_and_reused(
    neuronx: ModuleType, tiny_model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    """Right padding compiles other networks than batch 1's: the manifest names the batch and the padding side, the
    directory differs from the batch-1 one, and a load of the same config reuses it without compiling."""
    target = with_tokenizer(tiny_model_dirs["target"], tmp_path)
    compiled = {"compiled_dir": str(tmp_path / "compiled")}
    one = config_at(tiny_model_dirs, target, "library", 1, neuron=compiled)
    config = config_at(tiny_model_dirs, target, "library", BATCH, neuron=compiled)
    singles = compile_models(one, plan_deployment(one), [K])
    results = compile_models(config, plan_deployment(config), [K])
    for result in results:
        constructor = json.loads((Path(result.location) / MANIFEST).read_text())["constructor"]
        assert constructor["batch_size"] == BATCH and constructor["padding_side"] == "right"
        assert "continuous_batching" not in constructor
    for result in singles:
        assert "padding_side" not in json.loads((Path(result.location) / MANIFEST).read_text())["constructor"]
    assert not {r.location for r in results} & {r.location for r in singles}
    neuronx.RUNTIME.events.clear()
    with pytest.warns(UserWarning, match="self-test skipped"):
        load_pipeline(config)
    assert [d["directory"] for _, call, d in neuronx.RUNTIME.events if call == "load"] == [
        result.location for result in results
    ]
    assert "compile" not in neuronx.RUNTIME.calls()
