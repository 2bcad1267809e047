"""`neuron-ssp deploy image build|push`: the neuron-ssp serving image for SageMaker, into ECR."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import click

from neuron_ssp.cli.aws_options import consoles, region_option
from neuron_ssp.config import load_config
from neuron_ssp.deploy.ami import DlamiPin, pin_for_config
from neuron_ssp.deploy.sagemaker import image
from neuron_ssp.deploy.sagemaker.aws import SageMakerClients
from neuron_ssp.deploy.sagemaker.plan import IMAGE_REPOSITORY
from neuron_ssp.errors import Problem, UsageError


@click.group("image")
def image_group() -> None:
    """Build the neuron-ssp serving image (deploy/sagemaker/Dockerfile) and push it to ECR."""


def _version_tag(config_path: Path | None = None) -> str:
    """This version's tag, for the config's Neuron library (NxD Inference images carry their SDK)."""
    try:
        package = version("neuron-ssp")
    except PackageNotFoundError:
        package = "latest"
    return image.image_tag(package, _pin(config_path))


def _pin(config_path: Path | None) -> DlamiPin | None:
    return pin_for_config(load_config(config_path)) if config_path is not None else None


config_option = click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path),
    default=None,
    help="The config the image serves: an NxD Inference config (neuron.library: nxdi) builds FROM the NxDI DLC "
    "of its SDK (2.28 for inf2/trn1, 2.31 for trn2) and tags the image ...-nxdi-sdkX; a vllm-neuron config FROM "
    "the vLLM NeuronX DLC (SDK 2.32), tagged ...-vllm-neuron-sdk2.32.",
)


@image_group.command("build")
@click.option("--tag", default=None, help="Image tag (default: this package's version).")
@click.option("--base-image", help="Override the pinned Neuron DLC (BASE_IMAGE build argument).")
@config_option
def image_build(tag: str | None, base_image: str | None, config_path: Path | None) -> None:
    """docker build from the repository root; without docker, print the command."""
    _, err = consoles()
    if not Path(image.DOCKERFILE).is_file():
        raise UsageError(
            Problem(
                "working directory",
                str(Path.cwd()),
                f"{image.DOCKERFILE} is not here",
                "run this from the neuron-ssp source tree (the build context)",
            )
        )
    pin = _pin(config_path)
    if pin is not None:
        err.print(f"serving image for {pin.describe(load_config(config_path).neuron.library)}")
    tag = tag or _version_tag(config_path)
    steps = image.build_steps(tag, base_image or (pin.dlc if pin else None), pin.library_module if pin else None)
    if not image.docker_available():
        err.print("docker is not installed here; run this where it is:")
        for step in steps:
            click.echo(step.text())
        return
    image.run_steps(steps)
    err.print(f"[green]built[/green] {image.local_tag(tag)}")


@image_group.command("push")
@region_option
@click.option("--repository", default=IMAGE_REPOSITORY, show_default=True, help="ECR repository (created if missing).")
@click.option("--tag", default=None, help="Image tag (default: this package's version).")
@config_option
def image_push(region: str | None, repository: str, tag: str | None, config_path: Path | None) -> None:
    """Create the ECR repository if missing, log docker in, tag and push; print the image URI."""
    out, err = consoles()
    tag = tag or _version_tag(config_path)
    clients = SageMakerClients.for_region(region)
    uri = image.ensure_repository(clients.ecr, repository, clients.region)
    steps = image.push_steps(clients.ecr, uri, tag, clients.region)
    if not image.docker_available():
        err.print("docker is not installed here; run these where the image was built:")
        for step in steps:
            click.echo(step.text())
    else:
        image.run_steps(steps)
    out.print(f"image: {uri}:{tag}  (pass it as --image-uri, or leave it out: it is the default)")
