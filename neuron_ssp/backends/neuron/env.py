"""What this host offers for Neuron: devices, cores, instance type, packages, venv, compile cache.

Read-only probes with no Neuron import (the doctor must run where nothing Neuron is installed).
The instance metadata service is not assumed reachable: the instance type comes from neuron-ls, the
driver's sysfs, or the NeuronCore count when that is unambiguous.
"""

from __future__ import annotations

import glob
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

DEV_GLOB = "/dev/neuron*"
MEMINFO = "/proc/meminfo"
SYSFS_INSTANCE_TYPE = "/sys/devices/virtual/neuron_device/neuron0/info/architecture/instance_type"
NEURON_LS_FALLBACK = "/opt/aws/neuron/bin/neuron-ls"
DLAMI_VENV = "/opt/aws_neuronx_venv_pytorch_2_7_transformers"  # transformers-neuronx venv, SDK 2.24-2.25
DEFAULT_COMPILE_CACHE = "/var/tmp/neuron-compile-cache"
# The Neuron venv's own builds (transformers-neuronx or NxD Inference venvs): installing neuron-ssp must not
# replace any of them, so the EC2 bootstrap and the SageMaker Dockerfile pin exactly these as constraints,
# and `doctor` reports their versions.
NEURON_STACK = (
    "torch",
    "torch-neuronx",
    "torch-xla",
    "transformers",
    "transformers-neuronx",
    "neuronx-distributed",
    "neuronx-distributed-inference",
    "neuronx-cc",
    "libneuronxla",
    "numpy",
)
# NeuronCore count -> instance, only where the count alone tells (2 cores: inf2.xlarge/8xlarge, trn1.2xlarge)
INSTANCE_BY_CORES = {12: "inf2.24xlarge", 24: "inf2.48xlarge"}


@dataclass(frozen=True)
class NeuronDevices:
    """Neuron devices as the driver and neuron-ls report them."""

    device_nodes: list[str] = field(default_factory=list)
    neuron_ls: str | None = None  # path of the tool, when installed
    neuron_ls_error: str | None = None
    cores: int | None = None  # NeuronCores, from neuron-ls
    instance_type: str | None = None
    instance_source: str = ""

    @property
    def present(self) -> bool:
        return bool(self.device_nodes) or bool(self.cores)


def device_nodes() -> list[str]:
    return sorted(glob.glob(DEV_GLOB))


def probe_devices(instance_override: str | None = None) -> NeuronDevices:
    nodes = device_nodes()
    tool = shutil.which("neuron-ls") or (NEURON_LS_FALLBACK if os.access(NEURON_LS_FALLBACK, os.X_OK) else None)
    cores, listed_type, error = (None, None, None)
    if tool:
        cores, listed_type, error = _run_neuron_ls(tool)
    instance, source = _instance_type(instance_override, listed_type, cores)
    return NeuronDevices(nodes, tool, error, cores, instance, source)


def _run_neuron_ls(tool: str) -> tuple[int | None, str | None, str | None]:
    """(NeuronCores, instance type if listed, error). Output: a list of devices with `nc_count`;
    newer tools wrap it as {"instance_type": ..., "neuron_devices": [...]}."""
    try:
        done = subprocess.run([tool, "--json-output"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, None, f"{tool} did not run: {exc}"
    if done.returncode != 0:
        return None, None, (done.stderr.strip() or f"exit status {done.returncode}")[:300]
    try:
        data = json.loads(done.stdout)
    except json.JSONDecodeError:
        return None, None, "neuron-ls printed something that is not JSON"
    devices = data.get("neuron_devices", []) if isinstance(data, dict) else data
    instance = data.get("instance_type") if isinstance(data, dict) else None
    cores = sum(int(d.get("nc_count", 0)) for d in devices if isinstance(d, dict))
    return cores, instance, None


def _instance_type(override: str | None, listed: str | None, cores: int | None) -> tuple[str | None, str]:
    if override:
        return override, "--instance"
    if listed:
        return listed, "neuron-ls"
    try:
        sysfs = Path(SYSFS_INSTANCE_TYPE).read_text().strip()
    except OSError:
        sysfs = ""
    if sysfs:
        return sysfs, "Neuron driver (sysfs)"
    if cores in INSTANCE_BY_CORES:
        return INSTANCE_BY_CORES[cores], f"{cores} NeuronCores"
    if cores == 32:
        return "trn1.32xlarge", "32 NeuronCores (trn1n.32xlarge has as many)"
    return None, ""


def host_memory_available() -> int | None:
    """MemAvailable of the host in bytes (what new processes can take without swapping); None where unreadable."""
    try:
        for line in Path(MEMINFO).read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024  # reported in kB
    except (OSError, ValueError, IndexError):
        return None
    return None


def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in NEURON_STACK:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def stack_warning(versions: dict[str, str | None]) -> str | None:
    """A combination nobody has run: transformers 5 beside transformers-neuronx (the DLAMI venvs carry 4.x)."""
    transformers = versions.get("transformers")
    if versions.get("transformers-neuronx") and transformers and not transformers.startswith("4."):
        return (
            f"transformers {transformers} beside transformers-neuronx {versions['transformers-neuronx']}: the "
            "Neuron venvs ship 4.x and nobody has run this pair; reinstall neuron-ssp with the venv's own "
            "versions as constraints (docs/neuron.md, 'Install on a Neuron DLAMI')"
        )
    return None


def active_venv() -> tuple[str, bool]:
    """(the Python environment in use, whether it is the DLAMI's transformers-neuronx venv)."""
    prefix = os.environ.get("VIRTUAL_ENV") or sys.prefix
    return prefix, Path(prefix).resolve() == Path(DLAMI_VENV).resolve()


@dataclass(frozen=True)
class CompileCache:
    url: str
    from_env: bool
    local_path: str | None  # None for s3:// caches
    free_bytes: int | None


def compile_cache() -> CompileCache:
    """Where neuronx-cc caches NEFFs (NEURON_COMPILE_CACHE_URL), and the free disk under it."""
    url = os.environ.get("NEURON_COMPILE_CACHE_URL") or DEFAULT_COMPILE_CACHE
    if url.startswith("s3://"):
        return CompileCache(url, "NEURON_COMPILE_CACHE_URL" in os.environ, None, None)
    path = Path(url)
    existing = next((p for p in (path, *path.parents) if p.exists()), Path("/"))
    return CompileCache(url, "NEURON_COMPILE_CACHE_URL" in os.environ, str(path), shutil.disk_usage(existing).free)
