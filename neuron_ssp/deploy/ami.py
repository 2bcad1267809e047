"""Which Neuron DLAMI to boot: one that still ships the venv of the config's Neuron library.

transformers-neuronx left the DLAMIs with Neuron SDK 2.26 (2025-09-18), and the public SSM parameter
`/aws/service/neuron/dlami/.../latest/image_id` only tracks the newest SDK. So the default ("pinned")
asks for Amazon's multi-framework DLAMI whose description names the SDK release (`*Neuron SDK 2.25*`),
the way Neuron's DLAMI guide finds a given release, rather than guessing it from build dates: a
rebuilt image of the same SDK (security patches) is still picked, a newer SDK never is. Its venv is
`/opt/aws_neuronx_venv_pytorch_2_7_transformers`; the bootstrap checks that it exists, so a wrong
pick fails at boot with a clear message, not mid-benchmark.

NxD Inference (`neuron.library: nxdi`) pins the same way, by instance family, from the one release table
(topology/nxdi_releases.py: Trn1/Inf2 on SDK 2.28, Trn2 on SDK 2.31, the last DLAMI with an NxD Inference
venv). Both are the multi-framework "Deep Learning AMI Neuron (Ubuntu 24.04)".
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from neuron_ssp.config import Config
from neuron_ssp.deploy.errors import aws_errors
from neuron_ssp.errors import Problem, RuntimeProblem, UsageError
from neuron_ssp.topology.catalog import find_instance
from neuron_ssp.topology.nxdi_releases import NxdiRelease, release_for
from neuron_ssp.topology.vllm_neuron import VLLM_NEURON

TRANSFORMERS_NEURONX_VENV = "/opt/aws_neuronx_venv_pytorch_2_7_transformers"
LATEST_PARAMETER = "/aws/service/neuron/dlami/multi-framework/ubuntu-22.04/latest/image_id"


@dataclass(frozen=True)
class DlamiPin:
    """The multi-framework DLAMI (by name) of one Neuron SDK release (by description)."""

    sdk: str
    name_prefix: str
    venv: str = TRANSFORMERS_NEURONX_VENV
    support: str = ""  # what the operator should know about this SDK before paying
    dlc: str | None = None  # the Neuron DLC of the same SDK (the SageMaker image's base); None: the Dockerfile's
    image_label: str = "nxdi"  # in the SageMaker image's tag, beside the SDK
    library_module: str = "transformers_neuronx"  # what the image build imports to check the library is there

    def describe(self, library: str) -> str:
        return f"{library} in {self.venv}, Neuron SDK {self.sdk} ({self.support})"

    def filters(self) -> list[dict[str, Any]]:
        return [
            {"Name": "name", "Values": [f"{self.name_prefix}*"]},
            {"Name": "description", "Values": [f"*Neuron SDK {self.sdk}*"]},
            {"Name": "architecture", "Values": ["x86_64"]},
            {"Name": "state", "Values": ["available"]},
        ]

    def accepts(self, image: dict[str, Any]) -> bool:
        """Checked again here: '*Neuron SDK 2.25*' would also match a '2.250', and the name a suffix."""
        name_ok = re.fullmatch(re.escape(self.name_prefix) + r"\d{8}", image.get("Name", ""))
        sdk_ok = re.search(r"Neuron SDK " + re.escape(self.sdk) + r"(?![\d])", image.get("Description", ""))
        return bool(name_ok and sdk_ok)


# SDK 2.25 is the last release whose DLAMI has the transformers-neuronx venv (2.26.0 removed it).
PINNED = DlamiPin(
    sdk="2.25",
    name_prefix="Deep Learning AMI Neuron (Ubuntu 22.04) ",
    support="transformers-neuronx: out of support since 2025-09-16, SDK 2.25 is its last release",
)
NXDI_DLAMI = "Deep Learning AMI Neuron (Ubuntu 24.04) "


def nxdi_pin(release: NxdiRelease) -> DlamiPin:
    """The DLAMI and DLC of an NxD Inference release. Its DLC: aws-neuron/deep-learning-containers README at
    2be9ed1 (2.32.0 ships no PyTorch inference DLC of its own; 2.31.1 is the newest with NxDI)."""
    return DlamiPin(
        sdk=release.sdk,
        name_prefix=NXDI_DLAMI,
        venv=release.venv,
        support=release.support,
        dlc=release.dlc,
        library_module="neuronx_distributed_inference",
    )


def pin_for_config(config: Config) -> DlamiPin:
    """The pin for a validated Neuron config (its instance type is a catalog entry)."""
    instance = find_instance(config.platform.instance_type or "")
    return pin_for(config.neuron.library, instance.generation if instance else "trn1")


# vllm-neuron: the multi-framework DLAMI of SDK 2.32 (Ubuntu 24.04, Inf2/Trn1/Trn2/Trn3: aws-neuron-sdk 81ce03ae
# deploy/environments/dlami.rst:67-69) and its vLLM venv (:89-90); topology/vllm_neuron.py holds the release.
VLLM_NEURON_PIN = DlamiPin(
    sdk=VLLM_NEURON.sdk,
    name_prefix=NXDI_DLAMI,
    venv=VLLM_NEURON.venv,
    support=f"vllm-neuron {VLLM_NEURON.plugin} (vLLM {VLLM_NEURON.vllm}), the supported serving stack",
    dlc=VLLM_NEURON.dlc,
    image_label="vllm-neuron",
    library_module="vllm",
)


def pin_for(library: str, generation: str) -> DlamiPin:
    """The DLAMI release that runs `library` on an instance of `generation`."""
    if library == "nxdi":
        return nxdi_pin(release_for(generation))
    if library == "vllm-neuron":
        return VLLM_NEURON_PIN
    return PINNED


@dataclass(frozen=True)
class Ami:
    image_id: str
    name: str
    created: str
    root_device: str
    source: str  # "pinned Neuron SDK 2.25", "latest SSM parameter" or "given"


def resolve_ami(choice: str, ec2: Any, ssm: Any, region: str, pin: DlamiPin = PINNED) -> Ami:
    """`pinned` (default: the DLAMI `pin` names), `latest`, or an explicit ami-... id."""
    if choice == "pinned":
        return find_pinned(ec2, region, pin)
    if choice == "latest":
        return find_latest(ec2, ssm, region)
    if choice.startswith("ami-"):
        return describe_one(ec2, choice, region, source="given")
    raise UsageError(
        Problem(
            "--ami",
            choice,
            "not a DLAMI choice",
            f"use 'pinned' (Neuron SDK {pin.sdk} DLAMI), 'latest' or an ami-... id",
        )
    )


def find_pinned(ec2: Any, region: str, pin: DlamiPin = PINNED) -> Ami:
    with aws_errors("ec2", region=region):
        images = ec2.describe_images(Owners=["amazon"], IncludeDeprecated=True, Filters=pin.filters())["Images"]
    fitting = sorted((i for i in images if pin.accepts(i)), key=lambda i: str(i.get("CreationDate", "")))
    if not fitting:
        raise RuntimeProblem(
            Problem(
                "--ami",
                "pinned",
                f"no {pin.name_prefix.strip()} DLAMI of Neuron SDK {pin.sdk} is visible in {region}",
                f"try another region (us-east-1, us-west-2), or pass --ami ami-... of an image with {pin.venv}",
            )
        )
    return _ami(fitting[-1], f"pinned Neuron SDK {pin.sdk}")


def find_latest(ec2: Any, ssm: Any, region: str) -> Ami:
    """Newest multi-framework DLAMI; only useful once you have checked it still ships transformers-neuronx."""
    with aws_errors("ssm", region=region):
        image_id = ssm.get_parameter(Name=LATEST_PARAMETER)["Parameter"]["Value"]
    return describe_one(ec2, image_id, region, source="latest SSM parameter")


def describe_one(ec2: Any, image_id: str, region: str, source: str) -> Ami:
    with aws_errors("ec2", region=region):
        images = ec2.describe_images(ImageIds=[image_id], IncludeDeprecated=True)["Images"]
    if not images:
        raise UsageError(
            Problem(
                "--ami",
                image_id,
                f"the image is not visible in {region}",
                "pass an AMI of this region, or use --ami pinned",
            )
        )
    return _ami(images[0], source)


def _ami(image: dict[str, Any], source: str) -> Ami:
    return Ami(
        image["ImageId"],
        image.get("Name", "?"),
        str(image.get("CreationDate", "?")),
        image.get("RootDeviceName", "/dev/sda1"),
        source,
    )
