"""The neuron-ssp engine's container: the config rewritten to the /opt/ml/model mount, as environment.

SageMaker copies the S3 prefix given as `ModelDataSource.S3DataSource` (S3Prefix, uncompressed) to
`/opt/ml/model`, for either engine. Each model of the config goes in a folder named like the last part
of its path, as in the EC2 deploy's `--weights-s3-uri`, and compiled artifacts go in `compiled/`.

The image (deploy/sagemaker/Dockerfile) starts `neuron-ssp serve --sagemaker` on the config it finds
in NEURON_SSP_CONFIG (JSON, which is YAML). Paths point at the mount: SageMaker copies the model
prefix there, read-only, so the compile cache goes to /tmp. With network isolation the container
reaches nothing, S3 included, so an s3:// artifact location is refused, not discovered at 2 a.m.
"""

from __future__ import annotations

import json
import posixpath
from typing import Any

from neuron_ssp.config import Config, compact_config_data
from neuron_ssp.errors import Problem

MODEL_MOUNT = "/opt/ml/model"
COMPILED_FOLDER = "compiled"
CONFIG_ENV = "NEURON_SSP_CONFIG"
CACHE_ENV = "NEURON_COMPILE_CACHE_URL"
WRITABLE_CACHE = "/tmp/neuron-compile-cache"
MAX_ENV_VALUE = 1024  # botocore sagemaker EnvironmentValue max length


def folder_name(path: str) -> str:
    """/opt/models/Llama-2-70b-hf -> Llama-2-70b-hf (also for s3:// URIs and trailing slashes)."""
    return posixpath.basename(path.rstrip("/")) or path


def mounted(path: str, root: str = MODEL_MOUNT) -> str:
    return posixpath.join(root, folder_name(path))


def container_config(config: Config) -> dict[str, Any]:
    """The config as the container must see it: model and artifact paths under /opt/ml/model."""
    data = compact_config_data(config)  # short: SageMaker limits an environment value to 1024 characters
    data["target"] = {**data.get("target", {}), "path": mounted(config.target.path)}
    if config.draft is not None:
        data["draft"] = {**data.get("draft", {}), "path": mounted(config.draft.path)}
    neuron = data.get("neuron", {})
    if config.neuron.compiled_dir and not config.neuron.compiled_dir.startswith("s3://"):
        neuron["compiled_dir"] = f"{MODEL_MOUNT}/{COMPILED_FOLDER}"
    if config.neuron.compile_cache_url and not config.neuron.compile_cache_url.startswith("s3://"):
        neuron["compile_cache_url"] = WRITABLE_CACHE
    if neuron:
        data["neuron"] = neuron
    return data


def container_environment(config: Config) -> dict[str, str]:
    data = container_config(config)
    env = {CONFIG_ENV: json.dumps(data, separators=(",", ":"), sort_keys=True)}
    if not data.get("neuron", {}).get("compile_cache_url"):
        env[CACHE_ENV] = WRITABLE_CACHE
    return env


def container_problems(config: Config, env: dict[str, str], network_isolation: bool) -> list[Problem]:
    problems = []
    if len(env[CONFIG_ENV]) > MAX_ENV_VALUE:
        problems.append(
            Problem(
                "config",
                f"{len(env[CONFIG_ENV])} characters as JSON",
                f"SageMaker limits an environment value to {MAX_ENV_VALUE} characters",
                "drop fields that repeat their defaults or shorten the model paths",
            )
        )
    if network_isolation:
        problems += s3_under_isolation(
            (
                ("neuron.compiled_dir", config.neuron.compiled_dir),
                ("neuron.compile_cache_url", config.neuron.compile_cache_url),
            )
        )
    return problems


def s3_under_isolation(fields: tuple[tuple[str, str | None], ...]) -> list[Problem]:
    """With network isolation the container reaches nothing: an s3:// location it would read is refused."""
    return [
        Problem(
            field,
            value,
            "with network isolation the container cannot reach S3",
            f"copy it under --model-s3 (e.g. as {COMPILED_FOLDER}/) and point to /opt/ml/model, "
            "or pass --no-network-isolation",
        )
        for field, value in fields
        if value and value.startswith("s3://")
    ]
