"""deploy/iam/sagemaker-operator-policy.json and sagemaker-execution-role.json judged by requests, not strings.

Each request the plan builds is turned into the authorizations AWS checks (action, resource ARN,
condition keys) and evaluated with `iam_policy`; so is what falls outside the tool's scope (another
service's scaling, another tag, another role, another bucket), which must be refused. Condition keys:
AWS Service Authorization Reference for SageMaker, Application Auto Scaling (service-specific keys
`application-autoscaling:service-namespace` and `application-autoscaling:scalable-dimension`, the
Application Auto Scaling User Guide, "How Application Auto Scaling works with IAM"), IAM, KMS, S3.
"""

from __future__ import annotations

import deploy_fixtures
import iam_policy
import pytest
import sagemaker_fixtures
from aws_authorization import ACCOUNT, authorizations
from sagemaker_fixtures import EXECUTION_ROLE, INF2_CONFIG, MODEL_S3, SAGEMAKER_POLICY, endpoint_plan

aws_sandbox = deploy_fixtures.aws_sandbox
OPERATOR = iam_policy.load(SAGEMAKER_POLICY)
ROLE = iam_policy.load(EXECUTION_ROLE)
KEY = f"arn:aws:kms:us-east-1:{ACCOUNT}:key/REPLACE-WITH-KMS-KEY-ID"


def planned_requests(**options: object) -> list[tuple[str, str, dict]]:
    plan = endpoint_plan(INF2_CONFIG, min_instances=1, max_instances=2, **options)
    return [
        ("sagemaker", "CreateModel", plan.model_request),
        ("sagemaker", "CreateEndpointConfig", plan.endpoint_config_request),
        ("sagemaker", "CreateEndpoint", plan.endpoint_request),
        ("application-autoscaling", "RegisterScalableTarget", plan.scaling.register_request()),
        ("application-autoscaling", "PutScalingPolicy", plan.scaling.policy_request()),
    ]


def test_every_create_request_is_allowed_on_its_resources_and_conditions() -> None:
    for service, operation, params in planned_requests(kms_key=KEY):
        for action, resource, context in authorizations(service, operation, params):
            assert iam_policy.allows(OPERATOR, action, resource, context), (action, resource, context)


def scaling_of(namespace: str, dimension: str) -> dict:
    return {
        "ServiceNamespace": namespace,
        "ResourceId": "table/orders",
        "ScalableDimension": dimension,
        "MinCapacity": 1,
        "MaxCapacity": 100,
    }


@pytest.mark.parametrize(
    "operation", ["RegisterScalableTarget", "DeregisterScalableTarget", "PutScalingPolicy", "DeleteScalingPolicy"]
)
def test_scaling_writes_are_refused_outside_sagemaker_variants(operation: str) -> None:
    for params in (
        scaling_of("dynamodb", "dynamodb:table:WriteCapacityUnits"),
        scaling_of("sagemaker", "sagemaker:inference-component:DesiredCopyCount"),
    ):
        action, resource, context = authorizations("application-autoscaling", operation, params)[0]
        assert action == f"application-autoscaling:{operation}"
        assert not iam_policy.allows(OPERATOR, action, resource, context), (action, context)


def test_reads_of_scaling_stay_unconditioned() -> None:
    params = {"ServiceNamespace": "sagemaker"}
    for action, resource, context in authorizations("application-autoscaling", "DescribeScalableTargets", params):
        assert iam_policy.allows(OPERATOR, action, resource, context)


def test_creation_outside_the_tools_scope_is_refused() -> None:
    requests = {operation: params for _, operation, params in planned_requests()}
    untagged = {**requests["CreateModel"], "Tags": []}
    other_type = {
        **requests["CreateEndpointConfig"],
        "ProductionVariants": [
            {**requests["CreateEndpointConfig"]["ProductionVariants"][0], "InstanceType": "ml.p5.48xlarge"}
        ],
    }
    other_role = {**requests["CreateModel"], "ExecutionRoleArn": f"arn:aws:iam::{ACCOUNT}:role/admin"}
    for operation, params, refused in (
        ("CreateModel", untagged, "sagemaker:CreateModel"),
        ("CreateEndpointConfig", other_type, "sagemaker:CreateEndpointConfig"),
        ("CreateModel", other_role, "iam:PassRole"),
    ):
        denied = [
            a for a, r, c in authorizations("sagemaker", operation, params) if not iam_policy.allows(OPERATOR, a, r, c)
        ]
        assert refused in denied, (operation, denied)


@pytest.mark.parametrize(("project", "allowed"), [("neuron-ssp", True), ("billing-db", False)])
def test_changing_an_endpoint_needs_the_tools_tag(project: str, allowed: bool) -> None:
    tags = {"Project": project}
    for operation, params in (
        ("DeleteEndpoint", {"EndpointName": "ep"}),
        ("DeleteModel", {"ModelName": "ep"}),
        ("UpdateEndpointWeightsAndCapacities", {"EndpointName": "ep"}),
    ):
        for action, resource, context in authorizations("sagemaker", operation, params, resource_tags=tags):
            assert iam_policy.allows(OPERATOR, action, resource, context) is allowed, (operation, project)


def test_execution_role_reads_the_model_prefix_pulls_the_image_writes_logs_and_nothing_else() -> None:
    """What SageMaker does with the role for the plan's model, and what it must not be able to do."""
    plan = endpoint_plan(INF2_CONFIG)
    image = plan.model_request["PrimaryContainer"]["Image"]
    repository = image.split("/", 1)[1].split(":")[0]
    account, region = image.split(".")[0], image.split(".")[3]
    bucket, prefix = "REPLACE-WITH-MODEL-BUCKET", "REPLACE-WITH-MODEL-PREFIX"  # as the file ships
    assert MODEL_S3.startswith("s3://")
    allowed = [
        ("s3:GetObject", f"arn:aws:s3:::{bucket}/{prefix}/Llama-2-70b-hf/model-00001.safetensors", {}),
        ("s3:ListBucket", f"arn:aws:s3:::{bucket}", {"s3:prefix": f"{prefix}/Llama-2-70b-hf/"}),
        (
            "kms:Decrypt",
            f"arn:aws:kms:{region}:{ACCOUNT}:key/REPLACE-WITH-MODEL-BUCKET-KMS-KEY-ID",
            {"kms:ViaService": f"s3.{region}.amazonaws.com"},
        ),
        ("ecr:GetAuthorizationToken", "*", {}),
        ("ecr:BatchGetImage", f"arn:aws:ecr:{region}:{account}:repository/{repository}", {}),
        ("ecr:GetDownloadUrlForLayer", f"arn:aws:ecr:{region}:{account}:repository/{repository}", {}),
        (
            "logs:PutLogEvents",
            f"arn:aws:logs:{region}:{ACCOUNT}:log-group:/aws/sagemaker/Endpoints/{plan.name}:log-stream:AllTraffic/i-1",
            {},
        ),
    ]
    refused = [
        ("s3:GetObject", f"arn:aws:s3:::{bucket}/other-prefix/secrets.txt", {}),
        ("s3:GetObject", "arn:aws:s3:::another-bucket/x", {}),
        ("s3:ListBucket", f"arn:aws:s3:::{bucket}", {"s3:prefix": "other-prefix/"}),
        ("s3:PutObject", f"arn:aws:s3:::{bucket}/{prefix}/x", {}),
        (
            "kms:Decrypt",
            f"arn:aws:kms:{region}:{ACCOUNT}:key/REPLACE-WITH-MODEL-BUCKET-KMS-KEY-ID",
            {"kms:ViaService": f"secretsmanager.{region}.amazonaws.com"},
        ),
        ("ecr:BatchGetImage", f"arn:aws:ecr:{region}:{account}:repository/another-image", {}),
        ("logs:PutLogEvents", f"arn:aws:logs:{region}:{ACCOUNT}:log-group:/aws/lambda/x:log-stream:y", {}),
    ]
    for action, resource, context in allowed:
        assert iam_policy.allows(ROLE, action, resource, context), (action, resource)
    for action, resource, context in refused:
        assert not iam_policy.allows(ROLE, action, resource, context), (action, resource)


sm_stub_session = sagemaker_fixtures.sm_stub_session
