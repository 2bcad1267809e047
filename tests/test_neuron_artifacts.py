"""Compiled artifacts: compile per k, save, and reuse at load only when everything matches."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest
from neuron_support import neuron_config

from neuron_ssp.backends.neuron.artifacts import MANIFEST, ArtifactStore, artifact_spec
from neuron_ssp.backends.neuron.compile import compile_models
from neuron_ssp.backends.neuron.load import load_neuron_backends
from neuron_ssp.errors import UsageError
from neuron_ssp.topology import plan_deployment

pytest_plugins = ["neuron_fixtures"]  # fixtures: neuronx, neuronx_any, tiny_model_dirs


def compile_config(tiny_model_dirs: dict[str, Path], store: str, **sections):
    return neuron_config(
        tiny_model_dirs["target"], tiny_model_dirs["draft"], neuron={"compiled_dir": store}, **sections
    )


def lifecycle(standin: ModuleType) -> list[tuple[str, str]]:
    keep = {"enable_speculative_decoder", "load", "to_neuron", "compile", "load_compiled_artifacts", "save"}
    return [(model, call) for model, call, _ in standin.RUNTIME.events if call in keep]


def test_one_compile_holds_every_k_and_loading_picks_k_at_run_time(
    neuronx: ModuleType, tiny_model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    config = compile_config(tiny_model_dirs, str(tmp_path / "compiled"))
    results = compile_models(config, plan_deployment(config), list(range(2, 9)))
    assert [(r.job.role, r.job.speculation_lengths, r.reused) for r in results] == [
        ("target", (2, 3, 4, 5, 6, 7, 8), False),
        ("draft", None, False),
    ]
    assert all(r.seconds > 0 for r in results)
    enabled = [d["speculation_length"] for _, c, d in neuronx.RUNTIME.events if c == "enable_speculative_decoder"]
    assert enabled == [[2, 3, 4, 5, 6, 7, 8]]  # one call, one model: the weights load once
    assert [c for m, c in lifecycle(neuronx) if m == "tiny-target"].count("save") == 1
    manifest = json.loads((Path(results[0].location) / MANIFEST).read_text())
    assert manifest["speculation_lengths"] == [2, 3, 4, 5, 6, 7, 8] and manifest["constructor"]["tp_degree"] == 2

    neuronx.RUNTIME.events.clear()
    target, _ = load_neuron_backends(config, plan_deployment(config))  # k = 4
    assert lifecycle(neuronx) == [
        ("tiny-target", "enable_speculative_decoder"),
        ("tiny-target", "load"),
        ("tiny-target", "to_neuron"),
        ("tiny-target", "load_compiled_artifacts"),
        ("tiny-draft", "load"),
        ("tiny-draft", "to_neuron"),
        ("tiny-draft", "load_compiled_artifacts"),
    ]
    loaded = [d["directory"] for m, c, d in neuronx.RUNTIME.events if c == "load" and m == "tiny-target"]
    assert loaded == [results[0].location]
    assert target.speculation_length == 4 and target.compiled_windows == [2, 3, 4, 5, 6, 7, 8]
    widths = {d["speculation_length"] for _, c, d in neuronx.RUNTIME.events if c == "speculative_forward"}
    assert widths == {4}  # the self-test scored 4-wide windows


def test_a_k_that_was_not_compiled_is_refused(
    neuronx: ModuleType, tiny_model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    config = compile_config(tiny_model_dirs, str(tmp_path / "compiled"))
    compile_models(config, plan_deployment(config), [2, 3, 4])
    wider = compile_config(tiny_model_dirs, str(tmp_path / "compiled"), speculation={"k": 6})
    with pytest.raises(UsageError) as caught:
        load_neuron_backends(wider, plan_deployment(wider))
    (problem,) = caught.value.problems
    assert problem.field == "speculation.k" and problem.value == 6
    assert "[2, 3, 4]" in problem.rule and "--k 2,3,4,6" in problem.fix


def test_a_build_that_takes_one_k_gets_one_model_per_k(
    neuronx: ModuleType, tiny_model_dirs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from neuron_support import reimport_standin

    standin = reimport_standin(monkeypatch, NEURONX_STANDIN_ONE_K="1")
    config = compile_config(tiny_model_dirs, str(tmp_path / "compiled"))
    results = compile_models(config, plan_deployment(config), [2, 3, 4])
    assert [(r.job.role, r.job.speculation_lengths) for r in results] == [
        ("target", (2,)),
        ("target", (3,)),
        ("target", (4,)),
        ("draft", None),
    ]
    enabled = [d["speculation_length"] for _, c, d in standin.RUNTIME.events if c == "enable_speculative_decoder"]
    assert enabled == [2, 3, 4]
    standin.RUNTIME.events.clear()
    target, _ = load_neuron_backends(config, plan_deployment(config))
    loaded = [d["directory"] for m, c, d in standin.RUNTIME.events if c == "load" and m == "tiny-target"]
    assert loaded == [results[2].location] and target.compiled_windows == [4]


def test_compiling_again_reuses_unless_forced(
    neuronx: ModuleType, tiny_model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    config = compile_config(tiny_model_dirs, str(tmp_path / "compiled"))
    plan = plan_deployment(config)
    compile_models(config, plan, [4])
    assert all(r.reused for r in compile_models(config, plan, [4]))
    assert not any(r.reused for r in compile_models(config, plan, [4], force=True))


def test_artifacts_for_other_settings_are_not_reused(
    neuronx: ModuleType, tiny_model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    store = str(tmp_path / "compiled")
    config = compile_config(tiny_model_dirs, store)
    compile_models(config, plan_deployment(config), [4])
    neuronx.RUNTIME.events.clear()
    other = compile_config(tiny_model_dirs, store, target={"n_positions": 96}, draft={"n_positions": 96})
    load_neuron_backends(other, plan_deployment(other))
    assert ("tiny-target", "compile") in lifecycle(neuronx)
    assert ("tiny-target", "load") not in lifecycle(neuronx)


def test_a_manifest_that_disagrees_is_ignored_with_a_warning(
    neuronx: ModuleType, tiny_model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    config = compile_config(tiny_model_dirs, str(tmp_path / "compiled"))
    (result, *_) = compile_models(config, plan_deployment(config), [4])
    manifest_path = Path(result.location) / MANIFEST
    manifest = json.loads(manifest_path.read_text())
    manifest_path.write_text(json.dumps({**manifest, "library_version": "0.12.313"}))
    spec = artifact_spec("target", tiny_model_dirs["target"], manifest["constructor"], [4], manifest["library_version"])
    with pytest.warns(UserWarning, match="library_version"):
        assert ArtifactStore(str(tmp_path / "compiled")).find(spec) is None


def test_compile_needs_a_store(neuronx: ModuleType, tiny_model_dirs: dict[str, Path]) -> None:
    config = neuron_config(tiny_model_dirs["target"])
    with pytest.raises(UsageError, match="compiled_dir"):
        compile_models(config, plan_deployment(config), [4])


def test_an_s3_store_uploads_and_downloads(
    neuronx: ModuleType, tiny_model_dirs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    boto3 = pytest.importorskip("boto3")
    moto = pytest.importorskip("moto")
    for name, value in (
        ("AWS_ACCESS_KEY_ID", "testing"),
        ("AWS_SECRET_ACCESS_KEY", "testing"),
        ("AWS_DEFAULT_REGION", "us-east-1"),
    ):
        monkeypatch.setenv(name, value)
    with moto.mock_aws():
        boto3.client("s3").create_bucket(Bucket="neff-bucket")
        config = compile_config(tiny_model_dirs, "s3://neff-bucket/compiled")
        results = compile_models(config, plan_deployment(config), [4])
        keys = [o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket="neff-bucket")["Contents"]]
        assert results[0].location.startswith("s3://neff-bucket/compiled/")
        assert any(key.endswith(MANIFEST) for key in keys) and len(keys) >= 4
        monkeypatch.setattr("neuron_ssp.backends.neuron.artifacts.LOCAL_CACHE", tmp_path / "fresh-cache")
        neuronx.RUNTIME.events.clear()
        load_neuron_backends(config, plan_deployment(config))
    assert ("tiny-target", "load_compiled_artifacts") in lifecycle(neuronx)
    assert ("tiny-target", "compile") not in lifecycle(neuronx)
