"""create -> status -> scale -> invoke -> logs -> list -> delete through the CLI, against moto on 127.0.0.1.

Real boto3 clients talk HTTP to one moto server for sagemaker, sagemaker-runtime,
application-autoscaling, logs, ecr and sts. moto puts an endpoint InService at once; the waiting,
Failed and Ctrl-C paths are in test_sagemaker_failures.py (Stubber).
"""

from __future__ import annotations

import json
import time
import urllib.request

import deploy_fixtures
import iam_policy
import pytest
import sagemaker_fixtures
from aws_authorization import authorizations
from click.testing import CliRunner
from deploy_fixtures import REGION, FakeSsmAgent, moto_client
from sagemaker_fixtures import MODEL_S3, SAGEMAKER_POLICY, create_args, instant_pacing

from neuron_ssp.cli import endpoint as endpoint_cli
from neuron_ssp.cli import main
from neuron_ssp.deploy.sagemaker import image

aws_sandbox = deploy_fixtures.aws_sandbox
moto = deploy_fixtures.moto
moto_endpoint = deploy_fixtures.moto_endpoint
moto_session = deploy_fixtures.moto_session
moto_hosts_neuron_types = sagemaker_fixtures.moto_hosts_neuron_types

POLICY = iam_policy.load(SAGEMAKER_POLICY)


@pytest.fixture(autouse=True)
def no_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(endpoint_cli, "PACING", instant_pacing())


def cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["deploy", *args], catch_exceptions=False)
    return result.exit_code, result.output


def as_tags(aws_tags: list[dict[str, str]]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in aws_tags}


def test_create_status_scale_invoke_logs_list_delete(
    moto: FakeSsmAgent, moto_endpoint: str, moto_hosts_neuron_types: None
) -> None:
    args = create_args("--name", "it-inf2", "--instances", "1", "--min", "1", "--max", "3", "--yes")
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    code, out = result.exit_code, result.output
    assert code == 0, out
    assert "InService" in out and "$46.74/h" in out  # 3 × ml.inf2.48xlarge at $15.58
    assert "bills every instance until it is deleted" in out and "list price as of 2026-09-27" in out

    sm = moto_client("sagemaker")
    model = sm.describe_model(ModelName="it-inf2")
    container = model["PrimaryContainer"]
    assert container["Image"] == f"123456789012.dkr.ecr.{REGION}.amazonaws.com/neuron-ssp:0.1.0"
    assert container["ModelDataSource"]["S3DataSource"] == {
        "S3Uri": MODEL_S3,
        "S3DataType": "S3Prefix",
        "CompressionType": "None",
    }
    served = json.loads(container["Environment"]["NEURON_SSP_CONFIG"])
    assert served["target"]["path"] == "/opt/ml/model/Llama-2-70b-hf"
    assert served["draft"]["path"] == "/opt/ml/model/Llama-2-7b-hf"
    assert served["neuron"]["compiled_dir"] == "/opt/ml/model/compiled"
    variant = sm.describe_endpoint_config(EndpointConfigName="it-inf2")["ProductionVariants"][0]
    assert variant["InstanceType"] == "ml.inf2.48xlarge" and variant["InitialInstanceCount"] == 1
    endpoint = sm.describe_endpoint(EndpointName="it-inf2")
    for arn in (endpoint["EndpointArn"], model["ModelArn"]):
        found = as_tags(sm.list_tags(ResourceArn=arn)["Tags"])
        assert found["Project"] == "neuron-ssp" and found["neuron-ssp:deployment"] == "it-inf2"
        assert found["neuron-ssp:engine"] == "neuron-ssp" and found["neuron-ssp:instance-type"] == "ml.inf2.48xlarge"
        assert found["neuron-ssp:owner"].startswith("arn:aws:")
    scaling = moto_client("application-autoscaling")
    (target,) = scaling.describe_scalable_targets(ServiceNamespace="sagemaker")["ScalableTargets"]
    assert target["ResourceId"] == "endpoint/it-inf2/variant/AllTraffic"
    assert (target["MinCapacity"], target["MaxCapacity"]) == (1, 3)
    (policy,) = scaling.describe_scaling_policies(ServiceNamespace="sagemaker")["ScalingPolicies"]
    tracking = policy["TargetTrackingScalingPolicyConfiguration"]
    assert (
        tracking["PredefinedMetricSpecification"]["PredefinedMetricType"]
        == "SageMakerVariantConcurrentRequestsPerModelHighResolution"
    )
    assert tracking["TargetValue"] == 1.0

    code, out = cli("endpoint", "status", "it-inf2", "--region", REGION, "--json")
    assert code == 0, out
    status = json.loads(out)
    assert status["status"] == "InService" and status["current_instances"] == 1
    assert (status["min_instances"], status["max_instances"]) == (1, 3) and status["usd_per_hour"] == 15.58

    code, out = cli("endpoint", "scale", "it-inf2", "--region", REGION, "--min", "2", "--max", "4")
    assert code == 0, out
    (target,) = scaling.describe_scalable_targets(ServiceNamespace="sagemaker")["ScalableTargets"]
    assert (target["MinCapacity"], target["MaxCapacity"]) == (2, 4)
    assert "tracking concurrency 1" in out  # a range change keeps the metric and its target
    code, out = cli("endpoint", "scale", "it-inf2", "--region", REGION, "--scaling-metric", "invocations")
    assert code == 2 and "--target-value" in out and "Traceback" not in out
    code, out = cli(
        "endpoint", "scale", "it-inf2", "--region", REGION, "--scaling-metric", "invocations", "--target-value", "30"
    )
    assert code == 0, out
    (policy,) = scaling.describe_scaling_policies(ServiceNamespace="sagemaker")["ScalingPolicies"]  # updated in place
    tracking = policy["TargetTrackingScalingPolicyConfiguration"]
    assert tracking["PredefinedMetricSpecification"]["PredefinedMetricType"] == "SageMakerVariantInvocationsPerInstance"
    assert tracking["TargetValue"] == 30.0
    (target,) = scaling.describe_scalable_targets(ServiceNamespace="sagemaker")["ScalableTargets"]
    assert (target["MinCapacity"], target["MaxCapacity"]) == (2, 4)  # the range is kept
    code, out = cli("endpoint", "scale", "it-inf2", "--region", REGION, "--target-value", "20")
    assert code == 0 and "tracking invocations 20" in out, out
    code, out = cli("endpoint", "scale", "it-inf2", "--region", REGION, "--instances", "2")
    assert code == 0, out
    assert sm.describe_endpoint(EndpointName="it-inf2")["ProductionVariants"][0]["CurrentInstanceCount"] == 2
    code, out = cli("endpoint", "scale", "it-inf2", "--region", REGION, "--instances", "9")
    assert code == 2 and "within the autoscaling range 2-4" in out

    answer = {"generated_text": "Paris.", "speculative": {"acceptance_rate": 0.75, "mean_accepted_length": 3.2}}
    queue = {
        "account_id": "123456789012",
        "region": REGION,
        "results": [
            {
                "Body": json.dumps(answer),
                "ContentType": "application/json",
                "InvokedProductionVariant": "AllTraffic",
                "CustomAttributes": "",
            }
        ],
    }
    urllib.request.urlopen(
        urllib.request.Request(
            f"{moto_endpoint}/moto-api/static/sagemaker/endpoint-results",
            data=json.dumps(queue).encode(),
            method="POST",
        )
    )
    code, out = cli("endpoint", "invoke", "it-inf2", "--region", REGION, "--prompt", "Capital of France?", "--json")
    assert code == 0, out
    assert json.loads(out) == {"text": "Paris.", "speculative": answer["speculative"]}

    logs = moto_client("logs")
    logs.create_log_group(logGroupName="/aws/sagemaker/Endpoints/it-inf2")
    logs.create_log_stream(logGroupName="/aws/sagemaker/Endpoints/it-inf2", logStreamName="AllTraffic/i-0abc")
    logs.put_log_events(
        logGroupName="/aws/sagemaker/Endpoints/it-inf2",
        logStreamName="AllTraffic/i-0abc",
        logEvents=[{"timestamp": int(time.time() * 1000) - 5 + i, "message": f"loading layer {i}"} for i in range(5)],
    )
    code, out = cli("endpoint", "logs", "it-inf2", "--region", REGION, "--lines", "2")
    assert code == 0, out
    assert "loading layer 4" in out and "loading layer 3" in out and "loading layer 2" not in out

    code, out = cli("endpoint", "list", "--region", REGION, "--json")
    listed = json.loads(out)
    assert [e["name"] for e in listed] == ["it-inf2"] and listed[0]["usd_per_hour"] == 2 * 15.58
    assert (listed[0]["min_instances"], listed[0]["max_instances"], listed[0]["scaling"]) == (2, 4, "invocations 20")
    code, out = cli("endpoint", "list", "--region", REGION)
    assert code == 0 and "2-4 invocations 20" in out, out

    code, out = cli("endpoint", "delete", "it-inf2", "--region", REGION, "--yes")
    assert code == 0, out
    assert sm.list_endpoints()["Endpoints"] == [] and sm.list_models()["Models"] == []
    assert sm.list_endpoint_configs()["EndpointConfigs"] == []
    assert scaling.describe_scalable_targets(ServiceNamespace="sagemaker")["ScalableTargets"] == []
    assert scaling.describe_scaling_policies(ServiceNamespace="sagemaker")["ScalingPolicies"] == []
    code, out = cli("endpoint", "delete", "it-inf2", "--region", REGION, "--yes")  # idempotent
    assert code == 0, out
    assert json.loads(cli("endpoint", "list", "--region", REGION, "--json")[1]) == []

    # every request sent above is allowed, on its resources and under its conditions, by the policy the error
    # messages point at
    used = {a for a in moto.actions if a.split(":")[0] in ("sagemaker", "application-autoscaling", "logs", "ecr")}
    assert {
        "sagemaker:CreateModel",
        "sagemaker:CreateEndpoint",
        "sagemaker:InvokeEndpoint",
        "application-autoscaling:PutScalingPolicy",
        "logs:GetLogEvents",
        "sagemaker:DeleteModel",
    } <= used
    assert_policy_allows_every_request(moto)


def assert_policy_allows_every_request(agent: FakeSsmAgent) -> None:
    """Tags of existing resources: those the code asked for when it created them (read back above from moto)."""
    created = {}
    for _, operation, params in agent.requests:
        if operation in ("CreateModel", "CreateEndpointConfig", "CreateEndpoint"):
            kind = {"CreateModel": "model", "CreateEndpointConfig": "endpoint-config"}.get(operation, "endpoint")
            name = params[{"model": "ModelName", "endpoint-config": "EndpointConfigName"}.get(kind, "EndpointName")]
            created[f"{kind}/{name.lower()}"] = {t["Key"]: t["Value"] for t in params["Tags"]}

    def tags_of(arn: str) -> dict[str, str]:
        return created[arn.split(":", 5)[5]]

    assert agent.requests
    for service, operation, params in agent.requests:
        for action, resource, context in authorizations(service, operation, params, tags_of=tags_of):
            assert iam_policy.allows(POLICY, action, resource, context), (operation, action, resource, context)


def test_image_push_creates_tagged_repository_and_prints_commands_without_docker(
    moto: FakeSsmAgent, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(image, "docker_available", lambda: False)
    code, out = cli("image", "push", "--region", REGION, "--tag", "0.1.0")
    assert code == 0, out
    ecr = moto_client("ecr")
    (repo,) = ecr.describe_repositories(repositoryNames=["neuron-ssp"])["repositories"]
    assert as_tags(ecr.list_tags_for_resource(resourceArn=repo["repositoryArn"])["tags"]) == {"Project": "neuron-ssp"}
    registry = repo["repositoryUri"].split("/")[0]
    assert (
        f"aws ecr get-login-password --region {REGION} | docker login --username AWS --password-stdin {registry}" in out
    )
    assert f"docker push {repo['repositoryUri']}:0.1.0" in out
    assert cli("image", "push", "--region", REGION, "--tag", "0.1.0")[0] == 0  # existing repository reused
    assert_policy_allows_every_request(moto)
