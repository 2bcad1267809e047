"""Build the neuron-ssp serving image and push it to ECR, where SageMaker can pull it.

docker does the building and pushing; boto3 does the ECR side (create the repository if missing, a
login token). Without docker on PATH the exact commands are printed instead, to run elsewhere.
"""

from __future__ import annotations

import base64
import shlex
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from neuron_ssp.deploy import tags
from neuron_ssp.deploy.ami import DlamiPin
from neuron_ssp.deploy.errors import translatable
from neuron_ssp.deploy.sagemaker.errors import is_not_found, sagemaker_errors, translate_sagemaker
from neuron_ssp.errors import Problem, RuntimeProblem

DOCKERFILE = "deploy/sagemaker/Dockerfile"
Runner = Callable[[list[str], "bytes | None"], int]


@dataclass(frozen=True)
class DockerStep:
    argv: list[str]
    stdin: bytes | None = None
    shown: str | None = None  # what to print instead of argv (secrets stay out of the terminal)

    def text(self) -> str:
        return self.shown or shlex.join(self.argv)


def image_tag(version_tag: str, pin: DlamiPin | None = None) -> str:
    """This version's tag; an NxD Inference or vllm-neuron image (its own DLC base) says so, so it never replaces
    another."""
    return version_tag if pin is None or pin.dlc is None else f"{version_tag}-{pin.image_label}-sdk{pin.sdk}"


def local_tag(version_tag: str) -> str:
    return f"neuron-ssp:{version_tag}"


def build_steps(version_tag: str, base_image: str | None = None, library_module: str | None = None) -> list[DockerStep]:
    argv = ["docker", "build", "-f", DOCKERFILE, "-t", local_tag(version_tag)]
    if base_image:
        argv += ["--build-arg", f"BASE_IMAGE={base_image}"]
    if library_module:
        argv += ["--build-arg", f"LIBRARY_MODULE={library_module}"]
    return [DockerStep([*argv, "."])]


def ensure_repository(ecr: Any, repository: str, region: str) -> str:
    """The repository URI, creating the repository (tagged, scan on push) if it does not exist."""
    try:
        found = ecr.describe_repositories(repositoryNames=[repository])["repositories"]
        return found[0]["repositoryUri"]
    except translatable() as exc:
        if not is_not_found(exc):
            raise translate_sagemaker(exc, "ecr", region=region) from None
    with sagemaker_errors("ecr", region=region):
        created = ecr.create_repository(
            repositoryName=repository,
            tags=[{"Key": tags.PROJECT_KEY, "Value": tags.PROJECT}],
            imageScanningConfiguration={"scanOnPush": True},
        )
    return created["repository"]["repositoryUri"]


def push_steps(ecr: Any, repository_uri: str, version_tag: str, region: str) -> list[DockerStep]:
    with sagemaker_errors("ecr", region=region):
        auth = ecr.get_authorization_token()["authorizationData"][0]
    user, password = base64.b64decode(auth["authorizationToken"]).decode().split(":", 1)
    registry = repository_uri.split("/", 1)[0]
    remote = f"{repository_uri}:{version_tag}"
    return [
        DockerStep(
            ["docker", "login", "--username", user, "--password-stdin", registry],
            password.encode(),
            shown=f"aws ecr get-login-password --region {region} | docker login --username AWS "
            f"--password-stdin {registry}",
        ),
        DockerStep(["docker", "tag", local_tag(version_tag), remote]),
        DockerStep(["docker", "push", remote]),
    ]


def docker_available() -> bool:
    return shutil.which("docker") is not None


def run_steps(steps: list[DockerStep], runner: Runner | None = None) -> None:
    run = runner or _subprocess_runner
    for step in steps:
        code = run(step.argv, step.stdin)
        if code != 0:
            raise RuntimeProblem(
                Problem(
                    "docker",
                    step.text(),
                    f"exited with code {code}",
                    "read docker's output above; is the daemon running and are you logged in?",
                )
            )


def _subprocess_runner(argv: list[str], stdin: bytes | None) -> int:
    return subprocess.run(argv, input=stdin, check=False).returncode
