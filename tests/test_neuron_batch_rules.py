"""One rule for batch > 1 on transformers-neuronx (topology/batch_rules.py): `validate`, given the installed build's
version, and the loader, which detects what the build does, give every (commit, engine, batch) the same verdict,
on the stand-in ported from each public commit (7a30b42, 0623de2, c8d6bdc, 1ade6d7). What they allow at batch 2
runs: every row's output is its own at batch 1."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
import torch
from neuron_support import neuron_config, prompt, with_tokenizer

from neuron_ssp.config import Config, SamplingConfig
from neuron_ssp.engines.rows import RowCallbacks
from neuron_ssp.errors import NeuronSSPError, UsageError
from neuron_ssp.pipeline.load import load_pipeline
from neuron_ssp.topology import validate_config
from neuron_ssp.topology.batch_rules import generation_for_version

pytest_plugins = ["neuron_fixtures"]  # fixtures: neuronx_commit, tiny_model_dirs
RULE_FIELDS = {"target.batch_size", "draft.batch_size", "speculation.engine"}
CASES = [(prompt(7, seed=1), 12), (prompt(11, seed=2), 9)]


def config_for(dirs: dict[str, Path], engine: str, batch: int) -> Config:
    """A draft-model config at `batch` (the self-test off: it checks a build's windows, not the batch rules)."""
    sizes = {"batch_size": batch, "n_positions": 128}
    return neuron_config(
        dirs["target"],
        dirs["draft"],
        speculation={"engine": engine},
        target=sizes,
        draft=sizes,
        neuron={"self_test": False},
        generation={"chat_template": False},
    )


def validate_verdict(config: Config, version: str) -> set[str]:
    report = validate_config(config, neuronx_generation=generation_for_version(version))
    return {problem.field for problem in report.errors} & RULE_FIELDS


def rows_alone_and_together(config: Config, batch: int) -> tuple[list[list[int]], list[list[int]]]:
    """Each case through the loaded pipeline at `batch`: alone (one row), then, at batch > 1, all together."""
    pipeline = load_pipeline(config, max_batch=batch)
    sampling = SamplingConfig()

    def run(cases: list[tuple[torch.Tensor, int]]) -> list[list[int]]:
        loop = pipeline.row_loop()
        rows = [loop.join(pipeline.row_request(ids, new, sampling, RowCallbacks())) for ids, new in cases]
        while loop.rows:
            loop.step()
        assert all(row.error is None for row in rows), [row.error for row in rows]
        return [row.seq.generated() for row in rows]

    alone = [run([case])[0] for case in CASES]
    return alone, run(CASES) if batch > 1 else alone


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("engine", ["native", "library", "fused"])
def test_validate_and_the_loader_give_the_same_verdict(
    neuronx_commit: ModuleType, tiny_model_dirs: dict[str, Path], tmp_path: Path, engine: str, batch: int
) -> None:
    dirs = {**tiny_model_dirs, "target": with_tokenizer(tiny_model_dirs["target"], tmp_path)}
    config = config_for(dirs, engine, batch)
    version = neuronx_commit.COMMITS[neuronx_commit.COMMIT]
    expected = validate_verdict(config, version)
    try:
        alone, together = rows_alone_and_together(config, batch)
    except NeuronSSPError as refused:
        assert isinstance(refused, UsageError), refused  # refused by the rules, before any model was built
        assert {problem.field for problem in refused.problems} == expected, refused
        assert "from_pretrained" not in neuronx_commit.RUNTIME.calls()
        return
    assert expected == set(), f"validate refuses {expected}, the loader ran"
    assert together == alone


def test_a_0623de2_build_is_refused_at_load_by_what_its_preprocessing_does(
    tiny_model_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """It takes batch_sizes= like 0.11 and calls itself 0.10 like 7a30b42; the probe sees its window come back at
    arange(64), and the refusal says so, naming base.py:291-295."""
    from neuron_fixtures import install_standin

    install_standin(monkeypatch, tmp_path, "sdk_2_21", "0623de2")
    from neuron_ssp.backends.neuron.api import load_neuronx

    api = load_neuronx()
    assert api.speculation_takes_batch_sizes and api.continuous_batching_class is not None
    assert api.window_kept is not None and "[[0, 1, 2, 3], [0, 1, 2, 3]]" in api.window_kept
    with pytest.raises(UsageError) as refused:
        load_pipeline(config_for(tiny_model_dirs, "native", 2), max_batch=2)
    problem = refused.value.problems[0]
    assert (problem.field, problem.value) == ("target.batch_size", 2)
    assert "0.10.0.360, which behaves as 0.10 with batch_sizes= (SDK 2.18; 0623de2)" in problem.rule
    assert "base.py:291-295 at 0623de2" in problem.rule and "transformers-neuronx 0.11-0.12" in problem.fix


def test_what_the_refusal_spares_0623de2_from(
    tiny_model_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Past the rule (patched out here), 0623de2's port writes both rows' windows over positions 0..3 of their
    caches: the second window of a row reads a cache its first one overwrote, and the rows go wrong."""
    from neuron_fixtures import install_standin

    from neuron_ssp.backends.base import Segment
    from neuron_ssp.backends.neuron.load import load_neuron_backends
    from neuron_ssp.topology import plan_deployment

    standin = install_standin(monkeypatch, tmp_path, "sdk_2_21", "0623de2")
    monkeypatch.setattr("neuron_ssp.topology.validate.check_batch", lambda *args, **kwargs: None)
    config = config_for(tiny_model_dirs, "native", 2)
    target, _ = load_neuron_backends(config, plan_deployment(config))
    target.prefill_slot(0, prompt(9, seed=1))
    target.prefill_slot(1, prompt(6, seed=2))
    target.score_batch([Segment(0, 9, torch.tensor([5, 6, 7, 8])), Segment(1, 6, torch.tensor([9, 10]))])
    (window,) = [d for _, call, d in standin.RUNTIME.events if call == "speculative_forward"]
    assert [row["cache_ids"] for row in window["executed"]] == [[0, 1, 2, 3], [0, 1, 2, 3]]
    assert target.model.caches[0][:4] == [5, 6, 7, 8]  # the prompt's first four tokens are gone
