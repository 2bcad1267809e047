"""What this host offers for NxD Inference, without importing it: the DLAMI venvs, the installed version and
the Neuron SDK release it ships in (the doctor runs where nothing Neuron is installed).

Neuron DLAMIs keep one venv per library; NxD Inference's is `/opt/aws_neuronx_venv_pytorch_<torch>_nxd_inference`
(the NxDI tutorials activate e.g. aws_neuronx_venv_pytorch_2_5_nxd_inference). Which SDK a version belongs to,
from the NxD Inference release notes (aws-neuron-sdk release-notes/components/nxd-inference.rst): 0.8.16251
is SDK 2.28, the last release whose models run on Trn1/Inf2; 0.9.17334 is 2.29 (Trn2 and newer only);
0.10.17970 and 0.10.18399 are 2.30 and 2.31; maintenance mode from 2.32.
"""

from __future__ import annotations

import glob
import importlib.metadata
from dataclasses import dataclass

from neuron_ssp.topology.nxdi_releases import release_for

NXDI_VENV_GLOB = "/opt/aws_neuronx_venv_pytorch_*_nxd_inference"
SDK_BY_VERSION = (("0.8.", "2.28"), ("0.9.", "2.29"), ("0.10.17", "2.30"), ("0.10.18", "2.31"))
LAST_TRN1_INF2_SDK = release_for("trn1").sdk  # topology/nxdi_releases.py, the table deploy and docs read


@dataclass(frozen=True)
class NxdiInstall:
    version: str | None  # neuronx-distributed-inference in this Python environment
    sdk: str | None  # the Neuron SDK release that version ships in, when known
    venvs: list[str]  # NxD Inference venvs of a Neuron DLAMI on this disk

    @property
    def runs_trn1_inf2(self) -> bool | None:
        """Whether this version's models run on Trn1/Inf2 (SDK <= 2.28); None when unknown."""
        if self.sdk is None:
            return None
        return tuple(map(int, self.sdk.split("."))) <= tuple(map(int, LAST_TRN1_INF2_SDK.split(".")))


def sdk_of(version: str) -> str | None:
    return next((sdk for prefix, sdk in SDK_BY_VERSION if version.startswith(prefix)), None)


def probe_nxdi() -> NxdiInstall:
    try:
        version: str | None = importlib.metadata.version("neuronx-distributed-inference")
    except importlib.metadata.PackageNotFoundError:
        version = None
    return NxdiInstall(version, sdk_of(version) if version else None, sorted(glob.glob(NXDI_VENV_GLOB)))
