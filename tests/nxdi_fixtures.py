"""Fixtures for the tests that run the real NxD Inference Python on CPU (loaded with `pytest_plugins`).

They run in the venv `.ci/nxdi.sh` builds (NxDI 0.9.0 and NxD from ../shared/vendor, transformers 4.57) and skip,
saying why, anywhere else: the main .venv has no NxDI, a plain clone has no ../shared/vendor.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

VENDOR = Path(__file__).resolve().parents[1].parent / "shared" / "vendor"


def nxdi_skip_reason() -> str | None:
    if not VENDOR.is_dir():
        return "../shared/vendor (the NxDI and NxD source snapshots) is absent: the NxDI tests need it"
    if importlib.util.find_spec("neuronx_distributed_inference") is None:
        return "NxD Inference is not installed in this venv: `bash .ci/nxdi.sh` builds .venv-nxdi and runs these tests"
    return None


@pytest.fixture(scope="session")
def nxdi_stubs() -> list[str]:
    """The import stubs for the closed-source Neuron modules; what was stubbed."""
    reason = nxdi_skip_reason()
    if reason:
        pytest.skip(reason)
    from nxdi_support import stubs

    return stubs.install()


@pytest.fixture
def nxdi(nxdi_stubs: list[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Any]:
    """NxDI with compile/load replaced by its CPU mode, a fake /dev/neuron0, no Neuron env vars, one thread."""
    from nxdi_support import patches

    dev = tmp_path / "dev"
    dev.mkdir()
    (dev / "neuron0").touch()
    monkeypatch.setattr("neuron_ssp.backends.neuron.env.DEV_GLOB", str(dev / "neuron*"))
    monkeypatch.setattr("neuron_ssp.backends.neuron.artifacts.LOCAL_CACHE", tmp_path / "artifact-cache")
    monkeypatch.setattr("neuron_ssp.backends.nxdi.load.LOCAL_CACHE", tmp_path / "artifact-cache")
    for name in ("NEURON_RT_VISIBLE_CORES", "NEURON_COMPILE_CACHE_URL"):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    patches.DEVICE_CALLS.clear()
    try:
        with patches.cpu_device():
            yield patches
    finally:
        torch.set_num_threads(threads)
