"""Plan one instance launch for one config: pure, no AWS call, no printing.

`check_launch` refuses a bad config or flag before anything is looked up; `plan_launch` turns the
config, the flags and what was looked up read-only (`LaunchFacts`, see `launch.look_up`) into the
exact run_instances request, its tags, user data, price and warnings. `launch` executes it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from neuron_ssp.config import DRAFTERS_WITH_DRAFT, EMBEDDED_PREFIX, Config
from neuron_ssp.deploy import tags
from neuron_ssp.deploy.ami import Ami, pin_for_config
from neuron_ssp.deploy.aws import kms_key_problem
from neuron_ssp.deploy.capacity import CapacityTarget, Reservation, check_reservation, run_instances_fields
from neuron_ssp.deploy.expiry import hours_problem
from neuron_ssp.deploy.userdata import BootstrapSpec, HfTokenSource, render
from neuron_ssp.deploy.vllm_neuron import command_text
from neuron_ssp.errors import Problem, UsageError
from neuron_ssp.topology import hourly_price_usd


@dataclass(frozen=True)
class LaunchOptions:
    region: str
    name: str | None = None
    ami: str = "pinned"
    subnet_id: str | None = None
    security_group_ids: tuple[str, ...] = ()
    key_name: str | None = None
    instance_profile: str | None = None
    capacity: CapacityTarget | None = None
    ttl_hours: float = 4.0
    volume_gb: int = 512
    kms_key: str | None = None
    weights_s3_uri: str | None = None
    output_s3_uri: str | None = None
    package_spec: str | None = None
    hf_token: HfTokenSource | None = None
    keep_on_failure: bool = False


@dataclass(frozen=True)
class LaunchPlan:
    """Everything decided before money is spent; `params` is the exact run_instances request."""

    name: str
    config_name: str
    instance_type: str
    region: str
    ami: Ami
    hourly_usd: float | None
    ttl_hours: float
    expires_at: datetime
    params: dict[str, Any]
    warnings: tuple[str, ...]
    keep_on_failure: bool
    reservation: Reservation | None = None
    software: str = ""  # the Neuron library, SDK, venv and their support status
    serves: str | None = None  # the server the bootstrap starts (vllm-neuron: the `vllm serve` command)

    @property
    def client_token(self) -> str:
        return self.params["ClientToken"]

    @property
    def in_capacity_block(self) -> bool:
        return self.reservation is not None and self.reservation.is_block

    @property
    def max_cost_usd(self) -> float | None:
        """Worst-case instance charge of this launch; None when unknown or prepaid (a Capacity Block)."""
        if self.hourly_usd is None or self.in_capacity_block:
            return None
        return self.hourly_usd * self.ttl_hours


@dataclass(frozen=True)
class LaunchFacts:
    """What planning needs from AWS, looked up read-only (`launch.look_up`)."""

    region: str
    ami: Ami
    owner: str  # the caller's ARN, for the owner tag
    reservation: Reservation | None = None


def check_launch(config: Config, options: LaunchOptions) -> tuple[str, list[str]]:
    """Every problem of the config and the flags at once, before any AWS call: (instance type, warnings)."""
    instance_type, config_warnings = _check_config(config)
    _check_options(options, instance_type)
    return instance_type, config_warnings


def deployment_name(config: Config, config_path: str | Path, options: LaunchOptions) -> str:
    return tags.check_deployment_name(options.name or default_name(config, config_path))


def expiry(now: datetime, options: LaunchOptions) -> datetime:
    """When the TTL ends: the instance terminates itself then."""
    return now + timedelta(hours=options.ttl_hours)


def plan_launch(
    config: Config,
    config_path: str | Path,
    options: LaunchOptions,
    facts: LaunchFacts,
    *,
    now: datetime,
    client_token: str,
) -> LaunchPlan:
    """The exact run_instances request and what the user must know before money is spent."""
    instance_type, warnings = check_launch(config, options)
    expires_at = expiry(now, options)
    name = deployment_name(config, config_path, options)
    pin = pin_for_config(config)
    if options.ami == "latest":
        warnings.append(
            f"--ami latest follows the newest Neuron SDK, which may no longer ship {pin.venv} "
            f"({config.neuron.library} is pinned to SDK {pin.sdk})"
        )
    vllm = config.neuron.library == "vllm-neuron"
    params = _base_params(options, instance_type, facts.ami, client_token)
    if options.capacity and facts.reservation:
        warnings += check_reservation(facts.reservation, options.capacity, instance_type, expires_at)
        params.update(run_instances_fields(options.capacity, facts.reservation, options.subnet_id))
    instance_tags = tags.launch_tags(
        deployment=name,
        config_name=config_name(config, config_path),
        owner=facts.owner,
        ttl_hours=options.ttl_hours,
        expires_at=expires_at,
        output_s3_uri=options.output_s3_uri,
    )
    params["TagSpecifications"] = tags.tag_specifications(instance_tags)
    params["UserData"] = render(
        BootstrapSpec(
            deployment=name,
            region=facts.region,
            config_yaml=yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False),
            model_paths=model_paths(config),
            expires_at=expires_at,
            package_spec=options.package_spec or default_package_spec(),
            weights_s3_uri=options.weights_s3_uri,
            hf_token=options.hf_token,
            venv=pin.venv,
            serve_on_boot=vllm,
        )
    )
    if not options.instance_profile:
        warnings.append(
            "no --instance-profile: SSM reaches the instance only if the account has Default Host "
            "Management Configuration; launch waits for SSM"
        )
    if not options.weights_s3_uri and model_paths(config):
        warnings.append(f"no --weights-s3-uri: the AMI must already hold {', '.join(model_paths(config))}")
    if vllm and not options.hf_token and len(model_paths(config)) < 1 + (config.draft is not None):
        warnings.append(
            "vLLM downloads the Hugging Face ids of this config at start; a gated model (Llama) needs a token: "
            "--hf-token-secret or --hf-token-parameter"
        )
    return LaunchPlan(
        name,
        config_name(config, config_path),
        instance_type,
        facts.region,
        facts.ami,
        hourly_price_usd(instance_type),
        options.ttl_hours,
        expires_at,
        params,
        tuple(warnings),
        options.keep_on_failure,
        facts.reservation,
        pin.describe(config.neuron.library),
        command_text(config) if vllm else None,
    )


def default_name(config: Config, config_path: str | Path) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", config_name(config, config_path).lower()).strip("-")[:63] or "neuron-ssp"


def config_name(config: Config, config_path: str | Path) -> str:
    return config.name if config.name != "default" else Path(config_path).stem


def model_paths(config: Config) -> tuple[str, ...]:
    """The model directories the instance must hold (target, draft model or head). vllm-neuron also takes Hugging
    Face ids (`org/name`), which vLLM downloads at start: those are not synced."""
    with_draft = config.draft is not None and config.speculation.drafter in DRAFTERS_WITH_DRAFT
    models = [config.target] + ([config.draft] if with_draft else [])
    paths = [m.path for m in models if not m.path.startswith(EMBEDDED_PREFIX)]
    if config.neuron.library == "vllm-neuron":
        paths = [p for p in paths if PurePosixPath(p).is_absolute()]
    return tuple(paths)


def default_package_spec() -> str:
    try:
        return f"neuron-ssp=={version('neuron-ssp')}"
    except PackageNotFoundError:
        return "neuron-ssp"


# Root volume: Neuron's setup guides ("when launching a Trn1, adjust your primary EBS volume size to a
# minimum of 512GB"). gp3's baseline of 125 MiB/s would make the ~150 GB weight sync take 20 min;
# 1000 MiB/s needs >= 4000 IOPS (gp3 allows 0.25 MiB/s per IOPS).
MIN_ROOT_VOLUME_GB = {"trn1": 512, "trn1n": 512, "trn2": 512}
ROOT_VOLUME_THROUGHPUT_MIBS = 1000
ROOT_VOLUME_IOPS = 4000


def min_root_volume_gb(instance_type: str) -> int:
    return MIN_ROOT_VOLUME_GB.get(instance_type.split(".")[0], 100)


def root_volume(options: LaunchOptions, device_name: str) -> dict[str, Any]:
    """The root EBS volume: encrypted (with --kms-key, or the account's default EBS key), deleted with the instance."""
    ebs: dict[str, Any] = {
        "VolumeSize": options.volume_gb,
        "VolumeType": "gp3",
        "Iops": ROOT_VOLUME_IOPS,
        "Throughput": ROOT_VOLUME_THROUGHPUT_MIBS,
        "Encrypted": True,
        "DeleteOnTermination": True,
    }
    if options.kms_key:
        ebs["KmsKeyId"] = options.kms_key
    return {"DeviceName": device_name, "Ebs": ebs}


def _check_options(options: LaunchOptions, instance_type: str) -> None:
    problems = []
    if bad_ttl := hours_problem("--ttl-hours", options.ttl_hours):
        problems.append(bad_ttl)
    minimum = min_root_volume_gb(instance_type)
    if options.volume_gb < minimum:
        problems.append(
            Problem(
                "--volume-gb",
                options.volume_gb,
                f"must be >= {minimum} on {instance_type}",
                "Neuron's setup guide asks for at least 512 GB on Trn instances; Llama-2-70B + 7B in bf16 need "
                f"~150 GB of weights plus compiled artifacts; keep the default {LaunchOptions.volume_gb}",
            )
        )
    if options.kms_key is not None and (bad_key := kms_key_problem(options.kms_key, "the account's default EBS key")):
        problems.append(bad_key)
    for flag, uri in (
        ("--weights-s3-uri", options.weights_s3_uri),
        ("--output-s3-uri", options.output_s3_uri),
    ):
        if uri and not re.match(r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/.*)?$", uri):
            problems.append(Problem(flag, uri, "not an s3://bucket/prefix URI", "write it as s3://my-bucket/models"))
        elif uri and not options.instance_profile:
            problems.append(
                Problem(
                    flag,
                    uri,
                    "the instance reads/writes S3 with its instance role",
                    "pass --instance-profile with a role that has deploy/iam/instance-role-policy.json",
                )
            )
    if problems:
        raise UsageError(problems)


def _check_config(config: Config) -> tuple[str, list[str]]:
    """Deploy needs a Neuron config with an instance type, valid for that instance's topology."""
    from neuron_ssp.topology import validate_config

    if config.platform.backend != "neuron" or not config.platform.instance_type:
        raise UsageError(
            Problem(
                "platform",
                config.platform.model_dump(),
                "deploy launches Neuron configs only",
                "set platform.backend: neuron and platform.instance_type (e.g. trn1.32xlarge)",
            )
        )
    report = validate_config(config)
    report.raise_if_invalid()
    return config.platform.instance_type, [str(w) for w in report.warnings]


def _base_params(options: LaunchOptions, instance_type: str, ami: Ami, client_token: str) -> dict[str, Any]:
    params: dict[str, Any] = {
        "ImageId": ami.image_id,
        "InstanceType": instance_type,
        "MinCount": 1,
        "MaxCount": 1,
        "ClientToken": client_token,
        "InstanceInitiatedShutdownBehavior": "terminate",
        "BlockDeviceMappings": [root_volume(options, ami.root_device)],
        # IMDSv2 only; instance tags readable there, so the expiry check on the instance sees an extension
        "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled", "InstanceMetadataTags": "enabled"},
    }
    if options.subnet_id:
        params["SubnetId"] = options.subnet_id
    if options.security_group_ids:
        params["SecurityGroupIds"] = list(options.security_group_ids)
    if options.key_name:
        params["KeyName"] = options.key_name
    if options.instance_profile:
        key = "Arn" if options.instance_profile.startswith("arn:") else "Name"
        params["IamInstanceProfile"] = {key: options.instance_profile}
    return params
