"""Everything an endpoint needs, decided and validated before any AWS call.

`check_endpoint` collects every problem of the config and the flags at once (exit 2, nothing
created, nothing called). `plan_endpoint` then builds the exact create_model / create_endpoint_config
/ create_endpoint requests and the autoscaling requests; the Stubber tests pin their shapes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Literal

from neuron_ssp.config import Config
from neuron_ssp.deploy import tags
from neuron_ssp.deploy.ami import DlamiPin, pin_for_config
from neuron_ssp.deploy.aws import kms_key_problem
from neuron_ssp.deploy.sagemaker.autoscaling import VARIANT, Capacity, ScalingMetric, ScalingPlan, target_for
from neuron_ssp.deploy.sagemaker.container import (
    container_config,
    container_environment,
    container_problems,
    s3_under_isolation,
)
from neuron_ssp.deploy.sagemaker.errors import EXECUTION_ROLE_POLICY
from neuron_ssp.deploy.sagemaker.image import image_tag
from neuron_ssp.deploy.sagemaker.instances import (
    HostingPrice,
    catalog_instance,
    has_local_nvme,
    hosting_price,
    ml_type,
    volume_size_gb,
)
from neuron_ssp.deploy.sagemaker.lmi import (
    LMI_BATCH_REASON,
    LMI_IMAGE_TAG,
    LMI_LIMITS,
    lmi_image,
    lmi_options,
    lmi_refusals,
)
from neuron_ssp.errors import NeuronSSPError, Problem, UsageError
from neuron_ssp.serve.capacity import serving_batch, serving_batch_reason

Engine = Literal["neuron-ssp", "lmi"]
ENGINE_KEY = "neuron-ssp:engine"
INSTANCE_TYPE_KEY = "neuron-ssp:instance-type"
MAX_INSTANCES_KEY = "neuron-ssp:max-instances"
SERVING_BATCH_KEY = "neuron-ssp:serving-batch"  # requests an instance runs at once: `endpoint scale`'s default target
IMAGE_REPOSITORY = "neuron-ssp"
# SageMaker's maximum for both: a 70B bf16 pair is ~150 GB to copy from S3, and loading it onto 24-32
# NeuronCores (longer still if artifacts must be compiled first) takes tens of minutes.
DOWNLOAD_TIMEOUT_S = 3600
STARTUP_TIMEOUT_S = 3600
_ENDPOINT_NAME = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")
_S3_PREFIX = re.compile(r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]/(.+/)?$")
_ROLE_ARN = re.compile(r"^arn:aws[a-z-]*:iam::\d{12}:role/[\w+=,.@/-]+$")
_IMAGE = re.compile(
    r"^\d{12}\.dkr\.ecr\.[a-z0-9-]+\.amazonaws\.com(\.cn)?/[a-z0-9._/-]+(:[\w.-]+|@sha256:[0-9a-f]{64})$"
)


@dataclass(frozen=True)
class EndpointOptions:
    name: str | None = None
    engine: Engine = "neuron-ssp"
    instance_type: str | None = None  # ml.*; default: ml. + the config's platform.instance_type
    instances: int = 1
    min_instances: int | None = None
    max_instances: int | None = None
    model_s3: str | None = None
    role_arn: str | None = None
    image_uri: str | None = None
    network_isolation: bool = True
    scaling_metric: ScalingMetric = "concurrency"
    target_value: float | None = None
    kms_key: str | None = None  # encrypts the EBS volume of an instance without local disk (inf2)
    keep_on_failure: bool = False

    @property
    def autoscaling(self) -> bool:
        return self.min_instances is not None or self.max_instances is not None


@dataclass(frozen=True)
class Identity:
    account: str
    arn: str


@dataclass(frozen=True)
class EndpointPlan:
    name: str
    region: str
    config_name: str
    engine: Engine
    ml_instance_type: str
    instances: int
    price: HostingPrice
    image_uri: str
    model_request: dict[str, Any]
    endpoint_config_request: dict[str, Any]
    endpoint_request: dict[str, Any]
    scaling: ScalingPlan | None
    keep_on_failure: bool
    capacity: Capacity = Capacity()
    warnings: list[str] = field(default_factory=list)
    software: str = ""  # the Neuron library and SDK the image runs, and their support status
    serves: str | None = None  # vllm-neuron: the `vllm serve` command the container's `neuron-ssp serve` runs

    @property
    def max_instances(self) -> int:
        return self.scaling.max_instances if self.scaling else self.instances

    def usd_per_hour(self, instances: int) -> float | None:
        return None if self.price.usd_per_hour is None else self.price.usd_per_hour * instances


def endpoint_name(options: EndpointOptions, config: Config, config_path: str | Path) -> str:
    if options.name:
        return options.name
    base = config.name if config.name != "default" else Path(config_path).stem
    return re.sub(r"-+", "-", re.sub(r"[^a-zA-Z0-9]+", "-", base)).strip("-")[:63] or "neuron-ssp"


def check_endpoint(
    config: Config, config_path: str | Path, options: EndpointOptions, *, for_create: bool = True
) -> tuple[Config, list[str]]:
    """All problems of config and flags at once; returns the config for the SageMaker instance type."""
    problems: list[Problem] = []
    name = endpoint_name(options, config, config_path)
    if not _ENDPOINT_NAME.match(name):
        problems.append(
            Problem(
                "--name",
                name,
                "SageMaker names are 1-63 letters, digits or single '-' inside",
                "pick a name such as llama2-70b-inf2",
            )
        )
    problems += _check_counts(options)
    if for_create:
        problems += _check_locations(options)
    config, instance_problems, warnings = _config_for_instance(config, options)
    problems += instance_problems
    if not instance_problems:
        problems += _check_kms_key(options, ml_type(config.platform.instance_type or ""))
    if not instance_problems:
        if options.engine == "lmi":
            problems += lmi_refusals(config)
            if options.network_isolation:  # LMI reads the NEFF cache from compile_cache_url
                problems += s3_under_isolation((("neuron.compile_cache_url", config.neuron.compile_cache_url),))
        else:
            problems += container_problems(config, container_environment(config), options.network_isolation)
            problems += _check_concurrency_target(config, options)
    if problems:
        raise UsageError(problems)
    return config, warnings


def serving_capacity(config: Config, engine: Engine) -> Capacity:
    """What one instance runs at once: our server's serving batch, or LMI's one request at a time."""
    if engine == "lmi":
        return Capacity(1, LMI_BATCH_REASON)
    return Capacity(serving_batch(config), serving_batch_reason(config))


def plan_endpoint(
    config: Config,
    config_path: str | Path,
    options: EndpointOptions,
    *,
    region: str,
    identity: Identity,
    seconds_per_request: float | None = None,
) -> EndpointPlan:
    """Build every request; `check_endpoint` must have passed (it is called again, cheaply)."""
    config, warnings = check_endpoint(config, config_path, options)
    name = endpoint_name(options, config, config_path)
    ml_instance = ml_type(config.platform.instance_type or "")
    cfg_name = config.name if config.name != "default" else Path(config_path).stem
    capacity = serving_capacity(config, options.engine)
    if options.engine == "lmi":
        environment = lmi_options(config).environment()
        image = options.image_uri or lmi_image(region)
    else:
        environment = container_environment(config)
        image = options.image_uri or default_image(identity.account, region, pin_for_config(config))
    resource_tags = [
        {"Key": k, "Value": v}
        for k, v in {
            tags.PROJECT_KEY: tags.PROJECT,
            tags.DEPLOYMENT_KEY: name,
            tags.CONFIG_KEY: cfg_name[:256],
            tags.OWNER_KEY: identity.arn[:256],
            ENGINE_KEY: options.engine,
            INSTANCE_TYPE_KEY: ml_instance,
            MAX_INSTANCES_KEY: str(options.max_instances or options.instances),
            SERVING_BATCH_KEY: str(capacity.slots),
        }.items()
    ]
    model_request = {
        "ModelName": name,
        "ExecutionRoleArn": options.role_arn,
        "PrimaryContainer": {
            "Image": image,
            "Mode": "SingleModel",
            "ModelDataSource": {
                "S3DataSource": {"S3Uri": options.model_s3, "S3DataType": "S3Prefix", "CompressionType": "None"}
            },
            "Environment": environment,
        },
        "EnableNetworkIsolation": options.network_isolation,
        "Tags": resource_tags,
    }
    endpoint_config_request = {
        "EndpointConfigName": name,
        "ProductionVariants": [
            {
                "VariantName": VARIANT,
                "ModelName": name,
                "InstanceType": ml_instance,
                "InitialInstanceCount": options.instances,
                "ModelDataDownloadTimeoutInSeconds": DOWNLOAD_TIMEOUT_S,
                "ContainerStartupHealthCheckTimeoutInSeconds": STARTUP_TIMEOUT_S,
                **_volume(config, ml_instance),
            }
        ],
        "Tags": resource_tags,
        **({"KmsKeyId": options.kms_key} if options.kms_key else {}),
    }
    endpoint_request = {"EndpointName": name, "EndpointConfigName": name, "Tags": resource_tags}
    scaling = None
    if options.autoscaling:
        try:
            value, why = target_for(options.scaling_metric, options.target_value, seconds_per_request, capacity)
        except ValueError:
            raise UsageError(
                Problem(
                    "--target-value",
                    None,
                    "the invocations metric needs a target and no "
                    "published latency of this model pair on this instance is known",
                    "pass --target-value (invocations per instance per minute) or use --scaling-metric concurrency",
                )
            ) from None
        scaling = ScalingPlan(
            name,
            options.min_instances or 1,
            options.max_instances or options.instances,
            options.scaling_metric,
            value,
            why,
        )
    if options.engine == "lmi":
        warnings = warnings + [f"LMI limits: {limit}" for limit in LMI_LIMITS] + lmi_options(config).notes
    return EndpointPlan(
        name,
        region,
        cfg_name,
        options.engine,
        ml_instance,
        options.instances,
        hosting_price(ml_instance),
        image,
        model_request,
        endpoint_config_request,
        endpoint_request,
        scaling,
        options.keep_on_failure,
        capacity,
        warnings,
        _software(config, options),
        _serves(config, options),
    )


def request_seconds(config: Config, slots: int) -> float | None:
    """Seconds one request takes with `slots` running at once: plain decoding (no speedup from speculation counted)
    of generation.max_new_tokens tokens, a call at that batch projected from the published batch-1 ms/token by the
    bytes it reads (topology/batch_projection.py; at batch 1 the published figure itself). None where no latency of
    the pair on that instance is published: the invocations metric then asks for --target-value."""
    from neuron_ssp.topology import plan_deployment
    from neuron_ssp.topology.batch_projection import plan_batch_projection
    from neuron_ssp.topology.projection import DEFAULT_ALPHA

    try:
        deployment = plan_deployment(config)
        projection = plan_batch_projection(config, deployment, config.speculation.engine, DEFAULT_ALPHA, [slots])
    except NeuronSSPError:  # architecture unknown here
        return None
    ms = projection.rows[0].target_call_ms  # plain decoding: one token per row and call
    return None if ms is None else ms * config.generation.max_new_tokens / 1000


def default_image(account: str, region: str, pin: DlamiPin | None = None) -> str:
    """Where `neuron-ssp deploy image push [--config CONFIG]` puts this version's image for the config's library."""
    try:
        tag = version("neuron-ssp")
    except PackageNotFoundError:
        tag = "latest"
    return f"{account}.dkr.ecr.{region}.amazonaws.com/{IMAGE_REPOSITORY}:{image_tag(tag, pin)}"


def _volume(config: Config, ml_instance_type: str) -> dict[str, int]:
    """VolumeSizeInGB for an instance without local disk, sized from the plan's weights; nothing on trn1."""
    from neuron_ssp.topology import plan_deployment

    if has_local_nvme(ml_instance_type):
        return {}
    weights = sum(model.footprint.weight_bytes for model in plan_deployment(config).models.values())
    return {"VolumeSizeInGB": volume_size_gb(weights)}


def _check_kms_key(options: EndpointOptions, ml_instance_type: str) -> list[Problem]:
    if options.kms_key is None:
        return []
    if has_local_nvme(ml_instance_type):
        return [
            Problem(
                "--kms-key",
                options.kms_key,
                f"{ml_instance_type} keeps the models on its local NVMe, which SageMaker encrypts with the "
                "instance's hardware and a KMS key does not cover",
                "leave --kms-key out on trn1/trn1n; it applies to the EBS volume of ml.inf2",
            )
        ]
    bad = kms_key_problem(options.kms_key, "a key SageMaker manages")
    return [bad] if bad else []


def _check_counts(options: EndpointOptions) -> list[Problem]:
    problems = []
    if options.instances < 1:
        problems.append(
            Problem(
                "--instances", options.instances, "an endpoint needs at least 1 instance", "pass --instances 1 or more"
            )
        )
    if options.autoscaling:
        low = options.min_instances if options.min_instances is not None else 1
        high = options.max_instances if options.max_instances is not None else options.instances
        if low < 1:
            problems.append(
                Problem("--min", low, "a real-time endpoint variant keeps at least 1 instance", "pass --min 1 or more")
            )
        if not low <= options.instances <= high:
            problems.append(
                Problem(
                    "--instances",
                    options.instances,
                    f"the starting count must lie within --min {low} and --max {high}",
                    "raise --max, lower --min, or change --instances",
                )
            )
    if options.scaling_metric == "invocations" and options.target_value is not None and options.target_value <= 0:
        problems.append(Problem("--target-value", options.target_value, "must be > 0", "pass a positive number"))
    if options.scaling_metric == "concurrency" and options.target_value is not None and options.target_value <= 0:
        problems.append(
            Problem(
                "--target-value", options.target_value, "must be > 0", "pass e.g. 1 (concurrent requests per model)"
            )
        )
    return problems


def _check_concurrency_target(config: Config, options: EndpointOptions) -> list[Problem]:
    """A concurrency target the container can never reach: past serving batch + serve.max_queue requests it answers
    503 at once, so the average stays below the target and autoscaling never adds an instance."""
    if not options.autoscaling or options.scaling_metric != "concurrency" or options.target_value is None:
        return []
    held = serving_batch(config) + config.serve.max_queue
    if options.target_value < held:
        return []
    return [
        Problem(
            "--target-value",
            options.target_value,
            f"an instance holds at most {held} requests ({serving_batch(config)} running + serve.max_queue "
            f"{config.serve.max_queue} waiting) and refuses the rest with 503, so its concurrency never reaches "
            "the target and autoscaling never scales out",
            f"pass a target below {held} (the default is explained in the plan), or raise serve.max_queue",
        )
    ]


def _check_locations(options: EndpointOptions) -> list[Problem]:
    problems = []
    if not options.model_s3:
        problems.append(
            Problem(
                "--model-s3",
                None,
                "SageMaker copies the models from an S3 prefix",
                "upload the model folders (see deploy/README.md) and pass --model-s3 s3://bucket/prefix/",
            )
        )
    elif not _S3_PREFIX.match(options.model_s3):
        problems.append(_model_s3_problem(options.model_s3))
    if not options.role_arn:
        problems.append(
            Problem(
                "--role-arn",
                None,
                "SageMaker runs the model with an execution role",
                f"create one with {EXECUTION_ROLE_POLICY} and pass its ARN",
            )
        )
    elif not _ROLE_ARN.match(options.role_arn):
        problems.append(
            Problem(
                "--role-arn",
                options.role_arn,
                "not an IAM role ARN",
                "write it as arn:aws:iam::123456789012:role/neuron-ssp-sagemaker",
            )
        )
    if options.image_uri and not _IMAGE.match(options.image_uri):
        problems.append(
            Problem(
                "--image-uri",
                options.image_uri,
                "SageMaker pulls images from ECR only",
                "push with `neuron-ssp deploy image push` and pass the URI it prints",
            )
        )
    return problems


def _model_s3_problem(uri: str) -> Problem:
    if not uri.startswith("s3://"):
        return Problem("--model-s3", uri, "not an s3:// URI", "write it as s3://my-bucket/models/")
    if not uri.endswith("/"):
        return Problem("--model-s3", uri, "an S3Prefix data source is a prefix ending with '/'", f"write {uri}/")
    return Problem(
        "--model-s3",
        uri,
        "the bucket name is not valid (3-63 lowercase letters, digits, '.', '-')",
        "use the name of an existing bucket of this region",
    )


def _config_for_instance(config: Config, options: EndpointOptions) -> tuple[Config, list[Problem], list[str]]:
    """The config with the SageMaker instance type applied, checked against that instance's topology."""
    from neuron_ssp.topology import validate_config

    if config.platform.backend != "neuron":
        return (
            config,
            [
                Problem(
                    "platform.backend",
                    config.platform.backend,
                    "SageMaker endpoints run Neuron configs only",
                    "use a config from configs/ (platform.backend: neuron)",
                )
            ],
            [],
        )
    wanted = options.instance_type or (
        ml_type(config.platform.instance_type) if config.platform.instance_type else None
    )
    if wanted is None:
        return (
            config,
            [
                Problem(
                    "--instance-type",
                    None,
                    "no instance type in the config or the flags",
                    "pass --instance-type ml.inf2.48xlarge or set platform.instance_type",
                )
            ],
            [],
        )
    try:
        instance = catalog_instance(wanted)
    except NeuronSSPError as exc:
        return config, exc.problems, []
    config = config.model_copy(update={"platform": config.platform.model_copy(update={"instance_type": instance.name})})
    report = validate_config(config)
    return config, list(report.errors), [str(w) for w in report.warnings]


def _serves(config: Config, options: EndpointOptions) -> str | None:
    """The command the container runs for a vllm-neuron config: its config as the container sees it (models under
    /opt/ml/model, SageMaker's 0.0.0.0:8080, where vLLM answers /ping and /invocations)."""
    if options.engine == "lmi" or config.neuron.library != "vllm-neuron":
        return None
    from neuron_ssp.config import config_from_dict
    from neuron_ssp.deploy.vllm_neuron import command_text

    seen = container_config(config)
    seen["serve"] = {**seen.get("serve", {}), "sagemaker": True}
    return command_text(config_from_dict(seen))


def _software(config: Config, options: EndpointOptions) -> str:
    if options.engine == "lmi":
        return f"transformers-neuronx in {LMI_IMAGE_TAG} (LMI's last Neuron release; out of support)"
    pin = pin_for_config(config)
    base = pin.dlc or "deploy/sagemaker/Dockerfile's BASE_IMAGE (pytorch-inference-neuronx 2.7.0, SDK 2.25)"
    return f"{pin.describe(config.neuron.library)}; image FROM {base}"
