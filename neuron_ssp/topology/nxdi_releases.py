"""Which NxD Inference release runs on which instance family: the one table the install advice, `doctor`,
`validate`, deploy's DLAMI and DLC pins and docs/neuron.md read (a test holds the docs' copy against it).

Why one pin per family, from aws-neuron/aws-neuron-sdk (81ce03ae):
- NxD Inference 0.9 (SDK 2.29) dropped Trn1/Inf2: "NxD Inference models are now only supported on Trn2 and
  newer hardware. Customers who require NxD Inference kernel support on Trn1 or Inf2 instances should pin to
  release 2.28" (release-notes/components/nxd-inference.rst:61). So trn1/inf2 stay on SDK 2.28, and an
  unpinned or '<0.11' install (0.10) gives them a library whose models do not run there.
- The SDK 2.32 DLAMIs ship no NxD Inference venv (release-notes/components/dlamis.rst:32), so trn2 boots the
  newest DLAMI that has one, SDK 2.31.
- Package versions: src/helperscripts/n2-manifest.json, releases 2.28.1 and 2.31.1 (the same NxDI, NxD,
  torch-neuronx and neuronx-cc as 2.28.0 and 2.31.0); the venv path: the DLAMI pages at tags v2.28.1
  (dlami/index.rst:106) and v2.31.1 (deploy/environments/dlami.rst:90).
"""

from __future__ import annotations

from dataclasses import dataclass

NEURON_INDEX = "https://pip.repos.neuron.amazonaws.com"
NXDI_VENV = "/opt/aws_neuronx_venv_pytorch_2_9_nxd_inference"
NXDI_DLC = "public.ecr.aws/neuron/pytorch-inference-neuronx:2.9.0-neuronx-py312-sdk{sdk}-ubuntu24.04"


@dataclass(frozen=True)
class NxdiRelease:
    """One Neuron SDK release's NxD Inference stack, as pip and the DLAMI install it."""

    sdk: str  # the release line a DLAMI's description names ("Neuron SDK 2.28")
    nxdi: str  # neuronx-distributed-inference
    nxd: str  # neuronx-distributed
    torch_neuronx: str
    neuronx_cc: str
    dlc: str  # the pytorch-inference-neuronx DLC of that SDK (the SageMaker image's base)
    support: str  # what an operator should know before paying for an instance
    venv: str = NXDI_VENV  # the NxD Inference venv of that SDK's multi-framework DLAMI

    @property
    def packages(self) -> dict[str, str]:
        return {
            "neuronx-distributed-inference": self.nxdi,
            "neuronx-distributed": self.nxd,
            "torch-neuronx": self.torch_neuronx,
            "neuronx-cc": self.neuronx_cc,
        }

    def pip_install(self) -> str:
        """The whole stack pinned: NxDI leaves neuronx-distributed unpinned, which would pull a newer SDK's."""
        pins = " ".join(f"{name}=={version}" for name, version in self.packages.items())
        return f"pip install {pins} --extra-index-url={NEURON_INDEX}"

    def advice(self) -> str:
        return f"Neuron SDK {self.sdk}: on its DLAMI source {self.venv}/bin/activate; elsewhere {self.pip_install()}"


SDK_2_28 = NxdiRelease(
    sdk="2.28",
    nxdi="0.8.16251",
    nxd="0.17.26814",
    torch_neuronx="2.9.0.2.12.22436",
    neuronx_cc="2.23.6484.0",
    dlc=NXDI_DLC.format(sdk="2.28.0"),
    support="NxD Inference 0.8: the last SDK whose NxDI models run on Trn1/Inf2 (an older release: no fixes for "
    "Trn1/Inf2 after it)",
)
SDK_2_31 = NxdiRelease(
    sdk="2.31",
    nxdi="0.10.18399",
    nxd="0.19.28492",
    torch_neuronx="2.9.0.2.15.32035",
    neuronx_cc="2.26.6360.0",
    dlc=NXDI_DLC.format(sdk="2.31.1"),
    support="NxD Inference 0.10: supported in maintenance mode (critical fixes only)",
)

# instance family (catalog.Instance.generation; trn1n.32xlarge is a trn1) -> the release that runs NxDI there
NXDI_BY_FAMILY: dict[str, NxdiRelease] = {"trn1": SDK_2_28, "inf2": SDK_2_28, "trn2": SDK_2_31}


def release_for(family: str) -> NxdiRelease:
    """The NxD Inference release for an instance family; KeyError for one the table does not hold."""
    return NXDI_BY_FAMILY[family]


def install_advice(family: str | None = None) -> str:
    """How to install NxD Inference for `family`, or for every family when it is not known here."""
    if family is not None:
        return f"on {family}, {release_for(family).advice()}"
    families: dict[NxdiRelease, list[str]] = {}
    for name, release in NXDI_BY_FAMILY.items():
        families.setdefault(release, []).append(name)
    return "; ".join(f"on {'/'.join(names)}, {release.advice()}" for release, names in families.items())
