"""Fixtures for the Neuron tests (loaded with `pytest_plugins`): the stand-in, a fake device, tiny models.

The stand-in transformers_neuronx lives in tests/standin and is importable only while a fixture
puts it on sys.path; every use is a fresh "process": modules purged, runtime state reset, the
Neuron environment variables unset before and after.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

import pytest
import torch
from neuron_support import STANDIN, save_tiny_llama
from transformers import LlamaForCausalLM


def _purge_standin() -> None:
    for name in [m for m in sys.modules if m.split(".")[0] == "transformers_neuronx"]:
        del sys.modules[name]


def _unset_env(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """Unset `name` now and after the test, even when the code under test sets it."""
    monkeypatch.setenv(name, "")
    monkeypatch.delenv(name)


def install_standin(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, api: str, commit: str = "") -> ModuleType:
    """Put the stand-in on sys.path and a fake /dev/neuron0 in place; return its runtime bookkeeping. `commit`, when
    given, names the imitated commit (else `api` names the first or the last)."""
    _purge_standin()
    monkeypatch.setenv("NEURONX_STANDIN_API", api)
    monkeypatch.setenv("NEURONX_STANDIN_COMMIT", commit)
    monkeypatch.syspath_prepend(str(STANDIN))
    dev = tmp_path / "dev"
    dev.mkdir(exist_ok=True)
    (dev / "neuron0").touch()
    monkeypatch.setattr("neuron_ssp.backends.neuron.env.DEV_GLOB", str(dev / "neuron*"))
    # host memory unknown: compiles keep the library's default parallelism unless a test sets MemAvailable
    monkeypatch.setattr("neuron_ssp.backends.neuron.env.MEMINFO", str(tmp_path / "no-meminfo"))
    for name in ("NEURON_RT_VISIBLE_CORES", "NEURON_COMPILE_CACHE_URL"):
        _unset_env(monkeypatch, name)
    monkeypatch.setattr("neuron_ssp.backends.neuron.artifacts.LOCAL_CACHE", tmp_path / "artifact-cache")
    import transformers_neuronx._standin as standin

    standin.reset()
    return standin


@contextmanager
def _one_thread() -> Iterator[None]:
    """Tiny models run fastest on one thread; several spin against each other on a busy CI runner."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        _purge_standin()


@pytest.fixture
def neuronx(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[ModuleType]:
    """The stand-in imitating the current API generation (SDK 2.21+)."""
    with _one_thread():
        yield install_standin(monkeypatch, tmp_path, "sdk_2_21")


@pytest.fixture
def neuronx_sdk_2_18(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[ModuleType]:
    """The stand-in imitating the older API generation (SDK 2.18, 0.10.x) alone."""
    with _one_thread():
        yield install_standin(monkeypatch, tmp_path, "sdk_2_18")


@pytest.fixture(params=["sdk_2_18", "sdk_2_21"])
def neuronx_any(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[ModuleType]:
    """The stand-in imitating each API generation in turn."""
    with _one_thread():
        yield install_standin(monkeypatch, tmp_path, request.param)


COMMITS = ("7a30b42", "0623de2", "c8d6bdc", "1ade6d7")  # the stand-in's generations, oldest first


@pytest.fixture(params=COMMITS)
def neuronx_commit(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[ModuleType]:
    """The stand-in imitating each public commit in turn, each ported from its own source."""
    with _one_thread():
        yield install_standin(monkeypatch, tmp_path, "sdk_2_21", request.param)


@pytest.fixture(scope="session")
def tiny_model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny-llamas")
    return {
        "target": save_tiny_llama(root / "tiny-target", seed=0),
        "draft": save_tiny_llama(root / "tiny-draft", seed=1),
    }


@pytest.fixture(scope="session")
def near_draft(tiny_model_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The target with noise on its output head: a draft that agrees with it at some positions only."""
    model = LlamaForCausalLM.from_pretrained(tiny_model_dirs["target"])
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        head = model.lm_head.weight
        head.add_(torch.randn(head.shape, generator=generator) * head.std() * 0.8)
    path = tmp_path_factory.mktemp("near") / "tiny-near-draft"
    model.save_pretrained(path)
    return {"target": tiny_model_dirs["target"], "draft": path}
