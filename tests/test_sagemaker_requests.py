"""Exact request shapes (botocore Stubber) and botocore's ParamValidator on every request we build."""

from __future__ import annotations

import json
from typing import Any

import boto3
import deploy_fixtures
import pytest
import sagemaker_fixtures
from click.testing import CliRunner
from sagemaker_fixtures import (
    INF2_CONFIG,
    MODEL_S3,
    ROLE_ARN,
    TRN1_CONFIG,
    StubbedSageMaker,
    assert_valid_request,
    create_args,
    described,
    endpoint_plan,
    instant_pacing,
)

from neuron_ssp.cli import main
from neuron_ssp.deploy.progress import Silent
from neuron_ssp.deploy.sagemaker import create, teardown
from neuron_ssp.deploy.sagemaker.aws import SageMakerClients

aws_sandbox = deploy_fixtures.aws_sandbox
sm_stub_session = sagemaker_fixtures.sm_stub_session
stubbed_sagemaker = sagemaker_fixtures.stubbed_sagemaker
CONFIGS = sorted((sagemaker_fixtures.ROOT / "configs").glob("llama*.yaml"))


def queue_create(stubs: StubbedSageMaker, plan: Any, *, statuses: tuple[str, ...] = ("Creating", "InService")) -> None:
    stubs.sagemaker.add_response(
        "create_model", {"ModelArn": "arn:aws:sagemaker:us-east-1:123456789012:model/x"}, plan.model_request
    )
    stubs.sagemaker.add_response(
        "create_endpoint_config",
        {"EndpointConfigArn": "arn:aws:sagemaker:us-east-1:123456789012:endpoint-config/x"},
        plan.endpoint_config_request,
    )
    stubs.sagemaker.add_response(
        "create_endpoint", {"EndpointArn": "arn:aws:sagemaker:us-east-1:123456789012:endpoint/x"}, plan.endpoint_request
    )
    for status in statuses:
        stubs.sagemaker.add_response("describe_endpoint", described(plan.name, status), {"EndpointName": plan.name})


def test_model_has_network_isolation_and_s3_prefix_and_the_variant_long_timeouts(
    stubbed_sagemaker: StubbedSageMaker,
) -> None:
    plan = endpoint_plan(TRN1_CONFIG, name="shape-trn1", min_instances=1, max_instances=4)
    assert plan.model_request["EnableNetworkIsolation"] is True
    assert plan.model_request["ExecutionRoleArn"] == ROLE_ARN
    assert plan.model_request["PrimaryContainer"]["Mode"] == "SingleModel"
    assert plan.model_request["PrimaryContainer"]["ModelDataSource"] == {
        "S3DataSource": {"S3Uri": MODEL_S3, "S3DataType": "S3Prefix", "CompressionType": "None"}
    }
    assert "ModelDataUrl" not in plan.model_request["PrimaryContainer"]
    assert plan.endpoint_config_request["ProductionVariants"] == [
        {
            "VariantName": "AllTraffic",
            "ModelName": "shape-trn1",
            "InstanceType": "ml.trn1.32xlarge",
            "InitialInstanceCount": 1,
            "ModelDataDownloadTimeoutInSeconds": 3600,
            "ContainerStartupHealthCheckTimeoutInSeconds": 3600,
        }
    ]
    assert plan.scaling is not None
    assert plan.scaling.register_request() == {
        "ServiceNamespace": "sagemaker",
        "ResourceId": "endpoint/shape-trn1/variant/AllTraffic",
        "ScalableDimension": "sagemaker:variant:DesiredInstanceCount",
        "MinCapacity": 1,
        "MaxCapacity": 4,
    }
    policy = plan.scaling.policy_request()
    assert policy["PolicyType"] == "TargetTrackingScaling"
    assert policy["TargetTrackingScalingPolicyConfiguration"]["PredefinedMetricSpecification"] == {
        "PredefinedMetricType": "SageMakerVariantConcurrentRequestsPerModelHighResolution"
    }

    stubs = stubbed_sagemaker
    queue_create(stubs, plan)
    stubs.autoscaling.add_response("register_scalable_target", {}, plan.scaling.register_request())
    stubs.autoscaling.add_response(
        "put_scaling_policy", {"PolicyARN": "arn:aws:autoscaling:x"}, plan.scaling.policy_request()
    )
    stubs.sagemaker.add_response("describe_endpoint", described("shape-trn1"), {"EndpointName": "shape-trn1"})
    clock = sagemaker_fixtures.FakeClock()
    result = create.create_endpoint(plan, stubs.clients, pacing=instant_pacing(clock), progress=Silent())
    assert result["EndpointStatus"] == "InService" and clock.sleeps == [30]
    stubs.assert_done()


@pytest.mark.parametrize("config_path", CONFIGS, ids=lambda p: p.stem)
@pytest.mark.parametrize("engine", ["neuron-ssp", "lmi"])
def test_every_request_passes_botocores_param_validator(
    config_path: Any, engine: str, stubbed_sagemaker: StubbedSageMaker
) -> None:
    clients = stubbed_sagemaker.clients
    plan = endpoint_plan(config_path, engine=engine, min_instances=1, max_instances=2, instances=2)
    assert_valid_request(clients.sagemaker, "CreateModel", plan.model_request)
    assert_valid_request(clients.sagemaker, "CreateEndpointConfig", plan.endpoint_config_request)
    assert_valid_request(clients.sagemaker, "CreateEndpoint", plan.endpoint_request)
    assert_valid_request(clients.autoscaling, "RegisterScalableTarget", plan.scaling.register_request())
    assert_valid_request(clients.autoscaling, "PutScalingPolicy", plan.scaling.policy_request())
    assert all(len(v) <= 1024 for v in plan.model_request["PrimaryContainer"]["Environment"].values())


def test_the_checker_refuses_what_param_validator_lets_through(stubbed_sagemaker: StubbedSageMaker) -> None:
    """A made-up metric or instance type passes botocore's ParamValidator; AWS would refuse both."""
    from botocore.validate import ParamValidator
    from service_model_check import request_problems

    clients = stubbed_sagemaker.clients
    plan = endpoint_plan(INF2_CONFIG, min_instances=1, max_instances=2)
    policy = plan.scaling.policy_request()
    policy["TargetTrackingScalingPolicyConfiguration"]["PredefinedMetricSpecification"]["PredefinedMetricType"] = (
        "SageMakerVariantMadeUpMetric"
    )
    config = json.loads(json.dumps(plan.endpoint_config_request))
    config["ProductionVariants"][0]["InstanceType"] = "ml.bogus.huge"
    for client, operation, params, words in (
        (clients.autoscaling, "PutScalingPolicy", policy, "'SageMakerVariantMadeUpMetric' is not one of"),
        (clients.sagemaker, "CreateEndpointConfig", config, "'ml.bogus.huge' is not one of"),
        (clients.sagemaker, "CreateEndpoint", {**plan.endpoint_request, "EndpointName": "bad_name"}, "pattern"),
        (
            clients.sagemaker,
            "CreateEndpointConfig",
            {**plan.endpoint_config_request, "KmsKeyId": "k" * 2049},
            "at most 2048",
        ),
    ):
        model = client.meta.service_model.operation_model(operation)
        assert not ParamValidator().validate(params, model.input_shape).has_errors()
        assert any(words in problem for problem in request_problems(model, params)), operation
    # and every client in these tests runs the check before sending
    with pytest.raises(pytest.fail.Exception, match="SageMakerVariantMadeUpMetric"):
        clients.autoscaling.put_scaling_policy(**policy)


def test_lmi_model_gets_option_environment_and_the_lmi_image(stubbed_sagemaker: StubbedSageMaker) -> None:
    plan = endpoint_plan(INF2_CONFIG, engine="lmi")
    container = plan.model_request["PrimaryContainer"]
    assert container["Image"] == "763104351884.dkr.ecr.us-east-1.amazonaws.com/djl-inference:0.30.0-neuronx-sdk2.20.1"
    env = container["Environment"]
    assert env["OPTION_ENTRYPOINT"] == "djl_python.transformers_neuronx"
    assert env["OPTION_MODEL_ID"] == "/opt/ml/model/Llama-2-70b-hf"
    assert env["OPTION_SPECULATIVE_DRAFT_MODEL"] == "/opt/ml/model/Llama-2-7b-hf"
    assert env["OPTION_SPECULATIVE_LENGTH"] == "5" and env["OPTION_TENSOR_PARALLEL_DEGREE"] == "24"
    assert env["OPTION_DRAFT_MODEL_TP_SIZE"] == "24" and env["OPTION_DTYPE"] == "bf16"
    assert env["OPTION_MAX_ROLLING_BATCH_SIZE"] == "1"


def test_no_network_isolation_flag_and_invocations_metric(stubbed_sagemaker: StubbedSageMaker) -> None:
    plan = endpoint_plan(TRN1_CONFIG, network_isolation=False, max_instances=3, scaling_metric="invocations")
    assert plan.model_request["EnableNetworkIsolation"] is False
    tracking = plan.scaling.policy_request()["TargetTrackingScalingPolicyConfiguration"]
    assert tracking["PredefinedMetricSpecification"]["PredefinedMetricType"] == "SageMakerVariantInvocationsPerInstance"
    assert tracking["TargetValue"] == 3.0  # 10 s per request: 6 a minute at full load, half of it
    assert "10.0 s per request" in plan.scaling.explanation


def variant_ids(name: str) -> dict[str, str]:
    """How Application Auto Scaling names an endpoint's variant in every request (literals, as AWS spells them)."""
    return {
        "ServiceNamespace": "sagemaker",
        "ResourceId": f"endpoint/{name}/variant/AllTraffic",
        "ScalableDimension": "sagemaker:variant:DesiredInstanceCount",
    }


def test_scale_turns_autoscaling_on_with_the_target_of_the_tagged_serving_batch(
    stubbed_sagemaker: StubbedSageMaker,
) -> None:
    """`create` tags the serving batch; `scale --min/--max` on an endpoint without autoscaling derives the default
    concurrency target from it (4 at once: 2.2 in the system keeps the slots ~50 % busy), not from batch 1."""
    from neuron_ssp.deploy.sagemaker.scale import scale

    stubs, name = stubbed_sagemaker, "batched"
    rid = variant_ids(name)
    tags = [
        {"Key": "neuron-ssp:instance-type", "Value": "ml.trn1.32xlarge"},
        {"Key": "neuron-ssp:serving-batch", "Value": "4"},
    ]
    target = {
        "MinCapacity": 1,
        "MaxCapacity": 3,
        "RoleARN": "arn:r",
        "CreationTime": described()["CreationTime"],
        **rid,
    }
    policy = {
        "PolicyName": f"{name}-target-tracking",
        "PolicyType": "TargetTrackingScaling",
        **rid,
        "TargetTrackingScalingPolicyConfiguration": {
            "TargetValue": 2.2,
            "PredefinedMetricSpecification": {
                "PredefinedMetricType": "SageMakerVariantConcurrentRequestsPerModelHighResolution"
            },
            "ScaleOutCooldown": 300,
            "ScaleInCooldown": 900,
        },
    }

    def describe(found_target: dict[str, Any] | None, policies: list[dict[str, Any]]) -> None:
        stubs.sagemaker.add_response("describe_endpoint", described(name), {"EndpointName": name})
        stubs.sagemaker.add_response("list_tags", {"Tags": tags}, {"ResourceArn": described(name)["EndpointArn"]})
        stubs.autoscaling.add_response(
            "describe_scalable_targets",
            {"ScalableTargets": [found_target] if found_target else []},
            {
                "ServiceNamespace": "sagemaker",
                "ResourceIds": [rid["ResourceId"]],
                "ScalableDimension": rid["ScalableDimension"],
            },
        )
        if found_target:
            stubs.autoscaling.add_response("describe_scaling_policies", {"ScalingPolicies": policies}, rid)

    describe(None, [])
    stubs.autoscaling.add_response("register_scalable_target", {}, {**rid, "MinCapacity": 1, "MaxCapacity": 3})
    stubs.autoscaling.add_response("put_scaling_policy", {"PolicyARN": "arn:aws:autoscaling:x"}, policy)
    assert_valid_request(stubs.clients.autoscaling, "PutScalingPolicy", policy)
    described_policy = {**policy, "PolicyARN": "arn:p", "CreationTime": described()["CreationTime"]}
    describe(target, [described_policy])
    info = scale(stubs.clients, name, min_instances=1, max_instances=3, instances=None)
    assert info.serving_batch == 4 and info.scaling == "concurrency 2.2"
    stubs.assert_done()


def test_delete_removes_policy_target_endpoint_config_model_in_order(stubbed_sagemaker: StubbedSageMaker) -> None:
    stubs, name = stubbed_sagemaker, "gone"
    rid = variant_ids(name)
    stubs.autoscaling.add_response(
        "describe_scaling_policies",
        {
            "ScalingPolicies": [
                {
                    "PolicyARN": "arn:p",
                    "PolicyName": f"{name}-target-tracking",
                    "PolicyType": "TargetTrackingScaling",
                    "CreationTime": described()["CreationTime"],
                    **rid,
                }
            ]
        },
        {k: rid[k] for k in rid},
    )
    stubs.autoscaling.add_response("delete_scaling_policy", {}, {"PolicyName": f"{name}-target-tracking", **rid})
    stubs.autoscaling.add_response(
        "describe_scalable_targets",
        {
            "ScalableTargets": [
                {
                    "MinCapacity": 1,
                    "MaxCapacity": 2,
                    "RoleARN": "arn:r",
                    "CreationTime": described()["CreationTime"],
                    "ServiceNamespace": "sagemaker",
                    "ResourceId": rid["ResourceId"],
                    "ScalableDimension": rid["ScalableDimension"],
                }
            ]
        },
        {
            "ServiceNamespace": "sagemaker",
            "ResourceIds": [rid["ResourceId"]],
            "ScalableDimension": rid["ScalableDimension"],
        },
    )
    stubs.autoscaling.add_response("deregister_scalable_target", {}, rid)
    stubs.sagemaker.add_response("describe_endpoint", described(name), {"EndpointName": name})
    stubs.sagemaker.add_response("delete_endpoint", {}, {"EndpointName": name})
    stubs.sagemaker.add_response(
        "describe_endpoint_config",
        {
            "EndpointConfigName": name,
            "EndpointConfigArn": "arn:aws:sagemaker:us-east-1:123456789012:endpoint-config/g",
            "ProductionVariants": [{"VariantName": "AllTraffic", "ModelName": name}],
            "CreationTime": described()["CreationTime"],
        },
        {"EndpointConfigName": name},
    )
    stubs.sagemaker.add_response("delete_endpoint_config", {}, {"EndpointConfigName": name})
    stubs.sagemaker.add_response(
        "describe_model",
        {
            "ModelName": name,
            "CreationTime": described()["CreationTime"],
            "ModelArn": "arn:aws:sagemaker:us-east-1:123456789012:model/g",
        },
        {"ModelName": name},
    )
    stubs.sagemaker.add_response("delete_model", {}, {"ModelName": name})
    removal = teardown.delete_endpoint(stubs.clients, name)
    assert removal.left == [] and removal.deleted == ["scaling", "endpoint", "endpoint config", "model"]
    stubs.assert_done()


def test_delete_of_nothing_only_describes(stubbed_sagemaker: StubbedSageMaker) -> None:
    """Second run: every piece is missing, so no delete is sent (the policy would refuse it)."""
    stubs, name = stubbed_sagemaker, "gone"
    rid = variant_ids(name)
    stubs.autoscaling.add_response("describe_scaling_policies", {"ScalingPolicies": []}, rid)
    stubs.autoscaling.add_response(
        "describe_scalable_targets",
        {"ScalableTargets": []},
        {
            "ServiceNamespace": "sagemaker",
            "ResourceIds": [rid["ResourceId"]],
            "ScalableDimension": rid["ScalableDimension"],
        },
    )
    for operation, key in (
        ("describe_endpoint", "EndpointName"),
        ("describe_endpoint_config", "EndpointConfigName"),
        ("describe_model", "ModelName"),
    ):
        stubs.sagemaker.add_client_error(
            operation,
            service_error_code="ValidationException",
            service_message=f"Could not find {key} 'arn:...:{name}'.",
            expected_params={key: name},
        )
    assert teardown.delete_endpoint(stubs.clients, name) == teardown.Removal([], [])
    stubs.assert_done()


def test_dry_run_prints_the_requests_and_calls_no_aws(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_clients(*_: Any, **__: Any) -> SageMakerClients:
        raise AssertionError("a dry run must not build AWS clients")

    monkeypatch.setattr(SageMakerClients, "for_region", no_clients)
    result = CliRunner().invoke(main, create_args("--max", "2", "--dry-run"))
    assert result.exit_code == 0, result.output
    requests = json.loads(result.output[result.output.index('{\n  "create_model"') : result.output.rindex("}") + 1])
    assert set(requests) == {
        "create_model",
        "create_endpoint_config",
        "create_endpoint",
        "register_scalable_target",
        "put_scaling_policy",
    }
    assert requests["create_model"]["EnableNetworkIsolation"] is True
    assert "no AWS API was called" in result.output and "$31.16/h" in result.output
    sm, scaling = (boto3.client(s, region_name="us-east-1") for s in ("sagemaker", "application-autoscaling"))
    for name, params in requests.items():
        client = scaling if name in ("register_scalable_target", "put_scaling_policy") else sm
        assert_valid_request(client, client.meta.method_to_api_mapping[name], params)


# inf2 has no local disk: SageMaker's large-model guidance ("SageMaker AI endpoint parameters for large model
# inference") says a model over 30 GB on such an instance needs VolumeSizeInGB slightly larger than the model.
@pytest.mark.parametrize("config_path", [c for c in CONFIGS if "inf2" in c.name], ids=lambda p: p.stem)
def test_inf2_variant_gets_a_volume_sized_from_the_plans_weights(config_path: Any) -> None:
    from neuron_ssp.config import load_config
    from neuron_ssp.topology import plan_deployment

    plan = endpoint_plan(config_path)
    (variant,) = plan.endpoint_config_request["ProductionVariants"]
    models = plan_deployment(load_config(config_path)).models.values()
    weights_gib = sum(m.footprint.weight_bytes for m in models) / 2**30
    assert weights_gib > 100  # a 70B pair: the default volume would not hold it
    assert weights_gib * 1.1 < variant["VolumeSizeInGB"] <= 512
    assert "KmsKeyId" not in plan.endpoint_config_request  # SageMaker's own key unless one is given


def test_trn1_variant_gets_no_volume_its_models_go_to_local_nvme() -> None:
    for config_path in (c for c in CONFIGS if "trn1" in c.name):
        (variant,) = endpoint_plan(config_path).endpoint_config_request["ProductionVariants"]
        assert "VolumeSizeInGB" not in variant


def test_kms_key_encrypts_the_inf2_volume_and_is_refused_on_trn1() -> None:
    from neuron_ssp.errors import UsageError

    key = "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"
    assert endpoint_plan(INF2_CONFIG, kms_key=key).endpoint_config_request["KmsKeyId"] == key
    with pytest.raises(UsageError) as raised:
        endpoint_plan(TRN1_CONFIG, kms_key=key)
    (problem,) = raised.value.problems
    assert problem.field == "--kms-key" and "NVMe" in problem.rule
    with pytest.raises(UsageError) as raised:
        endpoint_plan(INF2_CONFIG, kms_key="my key")
    assert [p.field for p in raised.value.problems] == ["--kms-key"]


def test_lmi_image_comes_from_the_registry_of_its_region_or_must_be_given() -> None:
    from sagemaker_fixtures import IDENTITY

    from neuron_ssp.config import load_config
    from neuron_ssp.deploy.sagemaker.plan import EndpointOptions, plan_endpoint
    from neuron_ssp.errors import UsageError

    def image(region: str, image_uri: str | None = None) -> str:
        options = EndpointOptions(name="lmi", engine="lmi", model_s3=MODEL_S3, role_arn=ROLE_ARN, image_uri=image_uri)
        plan = plan_endpoint(load_config(INF2_CONFIG), INF2_CONFIG, options, region=region, identity=IDENTITY)
        return plan.image_uri

    assert image("eu-west-1").startswith("763104351884.dkr.ecr.eu-west-1.amazonaws.com/djl-inference:")
    assert image("ca-west-1").startswith("204538143572.dkr.ecr.ca-west-1.amazonaws.com/djl-inference:")
    with pytest.raises(UsageError) as raised:
        image("ap-east-1")
    (problem,) = raised.value.problems
    assert problem.field == "--image-uri" and "ap-east-1" in problem.rule
    mine = "111122223333.dkr.ecr.ap-east-1.amazonaws.com/djl-inference:0.30.0-neuronx-sdk2.20.1"
    assert image("ap-east-1", mine) == mine
