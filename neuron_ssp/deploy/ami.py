"""Which Neuron DLAMI to boot: one that still ships the transformers-neuronx venv.

transformers-neuronx left the DLAMIs with Neuron SDK 2.26 (2025-09-18), and the public SSM parameter
`/aws/service/neuron/dlami/.../latest/image_id` only tracks the newest SDK. So the default ("pinned")
searches Amazon's own images by name and keeps those built in the SDK 2.24-2.25 window, whose
multi-framework DLAMI has `/opt/aws_neuronx_venv_pytorch_2_7_transformers`. The bootstrap checks that
the venv exists, so a wrong pick fails at boot with a clear message, not mid-benchmark.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from neuron_ssp.deploy.errors import aws_errors
from neuron_ssp.errors import Problem, RuntimeProblem, UsageError

TRANSFORMERS_NEURONX_VENV = "/opt/aws_neuronx_venv_pytorch_2_7_transformers"
LATEST_PARAMETER = "/aws/service/neuron/dlami/multi-framework/ubuntu-22.04/latest/image_id"


@dataclass(frozen=True)
class DlamiPin:
    """A name prefix plus the build-date window (YYYYMMDD, inclusive) of the SDK releases we support."""

    sdk: str
    name_prefix: str
    first_build: str
    last_build: str

    def name_patterns(self) -> list[str]:
        """describe_images name filters, one per month of the window (filters only know '*' and '?')."""
        months = []
        year, month = int(self.first_build[:4]), int(self.first_build[4:6])
        while f"{year:04d}{month:02d}" <= self.last_build[:6]:
            months.append(f"{self.name_prefix}{year:04d}{month:02d}*")
            year, month = (year + 1, 1) if month == 12 else (year, month + 1)
        return months

    def accepts(self, name: str) -> bool:
        match = re.fullmatch(re.escape(self.name_prefix) + r"(\d{8})", name)
        return bool(match) and self.first_build <= match.group(1) <= self.last_build


# SDK 2.24.0 shipped 2025-06-24 (first pytorch_2_7_transformers venv); 2.26.0 (2025-09-18) removed it.
PINNED = DlamiPin(
    sdk="2.24-2.25",
    name_prefix="Deep Learning AMI Neuron (Ubuntu 22.04) ",
    first_build="20250601",
    last_build="20250912",
)


@dataclass(frozen=True)
class Ami:
    image_id: str
    name: str
    created: str
    root_device: str
    source: str  # "pinned SDK 2.24-2.25", "latest SSM parameter" or "given"


def resolve_ami(choice: str, ec2: Any, ssm: Any, region: str) -> Ami:
    """`pinned` (default), `latest`, or an explicit ami-... id."""
    if choice == "pinned":
        return find_pinned(ec2, region)
    if choice == "latest":
        return find_latest(ec2, ssm, region)
    if choice.startswith("ami-"):
        return describe_one(ec2, choice, region, source="given")
    raise UsageError(
        Problem(
            "--ami",
            choice,
            "not a DLAMI choice",
            "use 'pinned' (Neuron SDK 2.24-2.25 DLAMI), 'latest' or an ami-... id",
        )
    )


def find_pinned(ec2: Any, region: str, pin: DlamiPin = PINNED) -> Ami:
    with aws_errors("ec2", region=region):
        images = ec2.describe_images(
            Owners=["amazon"],
            IncludeDeprecated=True,
            Filters=[
                {"Name": "name", "Values": pin.name_patterns()},
                {"Name": "architecture", "Values": ["x86_64"]},
                {"Name": "state", "Values": ["available"]},
            ],
        )["Images"]
    fitting = sorted((i for i in images if pin.accepts(i["Name"])), key=lambda i: i["Name"])
    if not fitting:
        raise RuntimeProblem(
            Problem(
                "--ami",
                "pinned",
                f"no Neuron DLAMI of SDK {pin.sdk} ({pin.name_prefix.strip()} "
                f"{pin.first_build}..{pin.last_build}) is visible in {region}",
                "try another region (us-east-1, us-west-2), or pass --ami ami-... of an image with "
                f"{TRANSFORMERS_NEURONX_VENV}",
            )
        )
    return _ami(fitting[-1], f"pinned SDK {pin.sdk}")


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
