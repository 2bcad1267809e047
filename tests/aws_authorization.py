"""The authorizations AWS checks for a request the deploy code sends: (IAM action, resource ARN, condition keys).

So a policy is judged by the very requests the code builds (`iam_policy.allows` on each triple), with the
resources and condition keys of the AWS Service Authorization Reference, not by its action names. Only
keys the services evaluate for that action and resource appear. Tags of existing resources come from
`resource_tags` (what the resource carries, e.g. read back from moto). An operation this table does not
know raises, so a new call cannot slip past the policy tests.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

ACCOUNT = "123456789012"
REGION = "us-east-1"
Authorization = tuple[str, str, dict[str, Any]]
TagsOf = Callable[[str], dict[str, str]]
NO_PERMISSION_NEEDED = {("sts", "GetCallerIdentity")}


def authorizations(
    service: str,
    operation: str,
    params: dict[str, Any],
    *,
    resource_tags: dict[str, str] | None = None,
    tags_of: TagsOf | None = None,
    region: str = REGION,
) -> list[Authorization]:
    """What AWS authorizes for one request; `resource_tags` (or `tags_of(arn)`) gives existing resources' tags."""
    if (service, operation) in NO_PERMISSION_NEEDED:
        return []
    lookup = tags_of or (lambda arn: dict(resource_tags or {}))
    builders = {
        "sagemaker": _sagemaker,
        "sagemaker-runtime": _sagemaker,
        "application-autoscaling": _scaling,
        "logs": _logs,
        "ecr": _ecr,
        "ec2": _ec2,
        "ssm": _ssm,
        "s3": _s3,
    }
    if service not in builders:
        raise KeyError(f"no authorization table for {service}:{operation}")
    return builders[service](operation, params, lookup, region)


def request_tags(tags: list[dict[str, str]] | None) -> dict[str, str]:
    return {f"aws:RequestTag/{t['Key']}": t["Value"] for t in tags or []}


def existing(prefix: str, arn: str, lookup: TagsOf) -> dict[str, str]:
    return {f"{prefix}/{k}": v for k, v in lookup(arn).items()}


def _sagemaker(operation: str, p: dict[str, Any], lookup: TagsOf, region: str) -> list[Authorization]:
    def arn(kind: str, name: str) -> str:
        return f"arn:aws:sagemaker:{region}:{ACCOUNT}:{kind}/{name.lower()}"

    tagged = request_tags(p.get("Tags"))
    creates = {
        "CreateModel": ("model", "ModelName"),
        "CreateEndpointConfig": ("endpoint-config", "EndpointConfigName"),
        "CreateEndpoint": ("endpoint", "EndpointName"),
    }
    if operation in creates:
        kind, key = creates[operation]
        resource = arn(kind, p[key])
        context = dict(tagged)
        if operation == "CreateEndpointConfig":
            context["sagemaker:InstanceTypes"] = [v["InstanceType"] for v in p["ProductionVariants"]]
        found = [(f"sagemaker:{operation}", resource, context)]
        if operation == "CreateEndpoint":
            found.append((f"sagemaker:{operation}", arn("endpoint-config", p["EndpointConfigName"]), dict(tagged)))
        if tagged:
            found.append(("sagemaker:AddTags", resource, dict(tagged)))
        if operation == "CreateModel":
            found.append(("iam:PassRole", p["ExecutionRoleArn"], {"iam:PassedToService": "sagemaker.amazonaws.com"}))
        if p.get("KmsKeyId"):
            via = {"kms:ViaService": f"sagemaker.{region}.amazonaws.com"}
            found += [("kms:CreateGrant", p["KmsKeyId"], via), ("kms:DescribeKey", p["KmsKeyId"], via)]
        return found
    named = {
        "DescribeModel": ("model", "ModelName"),
        "DeleteModel": ("model", "ModelName"),
        "DescribeEndpointConfig": ("endpoint-config", "EndpointConfigName"),
        "DeleteEndpointConfig": ("endpoint-config", "EndpointConfigName"),
        "DescribeEndpoint": ("endpoint", "EndpointName"),
        "DeleteEndpoint": ("endpoint", "EndpointName"),
        "UpdateEndpointWeightsAndCapacities": ("endpoint", "EndpointName"),
        "InvokeEndpoint": ("endpoint", "EndpointName"),
        "InvokeEndpointWithResponseStream": ("endpoint", "EndpointName"),
    }
    if operation in named:
        kind, key = named[operation]
        resource = arn(kind, p[key])
        action = "InvokeEndpoint" if operation.startswith("InvokeEndpoint") else operation
        return [(f"sagemaker:{action}", resource, existing("aws:ResourceTag", resource, lookup))]
    if operation in ("ListEndpoints", "ListTags"):
        return [(f"sagemaker:{operation}", "*", {})]
    raise KeyError(f"no authorization table for sagemaker:{operation}")


def _scaling(operation: str, p: dict[str, Any], lookup: TagsOf, region: str) -> list[Authorization]:
    context = {"application-autoscaling:service-namespace": p["ServiceNamespace"]}
    if "ScalableDimension" in p:
        context["application-autoscaling:scalable-dimension"] = p["ScalableDimension"]
    found: list[Authorization] = [(f"application-autoscaling:{operation}", "*", context)]
    if operation == "RegisterScalableTarget" and p["ServiceNamespace"] == "sagemaker":  # the first time only
        role = (
            "arn:aws:iam::" + ACCOUNT + ":role/aws-service-role/sagemaker.application-autoscaling.amazonaws.com/"
            "AWSServiceRoleForApplicationAutoScaling_SageMakerEndpoint"
        )
        found.append(
            (
                "iam:CreateServiceLinkedRole",
                role,
                {"iam:AWSServiceName": "sagemaker.application-autoscaling.amazonaws.com"},
            )
        )
    if operation not in (
        "RegisterScalableTarget",
        "DeregisterScalableTarget",
        "PutScalingPolicy",
        "DeleteScalingPolicy",
        "DescribeScalableTargets",
        "DescribeScalingPolicies",
    ):
        raise KeyError(f"no authorization table for application-autoscaling:{operation}")
    return found


def _logs(operation: str, p: dict[str, Any], lookup: TagsOf, region: str) -> list[Authorization]:
    group = f"arn:aws:logs:{region}:{ACCOUNT}:log-group:{p['logGroupName']}"
    if operation == "DescribeLogStreams":
        return [("logs:DescribeLogStreams", group, {})]
    if operation == "GetLogEvents":
        return [("logs:GetLogEvents", f"{group}:log-stream:{p['logStreamName']}", {})]
    raise KeyError(f"no authorization table for logs:{operation}")


def _ecr(operation: str, p: dict[str, Any], lookup: TagsOf, region: str) -> list[Authorization]:
    if operation == "GetAuthorizationToken":
        return [("ecr:GetAuthorizationToken", "*", {})]
    names = p.get("repositoryNames") or [p.get("repositoryName")]
    resources = [f"arn:aws:ecr:{region}:{ACCOUNT}:repository/{name}" for name in names]
    if operation == "DescribeRepositories":
        return [("ecr:DescribeRepositories", r, {}) for r in resources]
    if operation == "CreateRepository":
        tags = {f"aws:RequestTag/{t['Key']}": t["Value"] for t in p.get("tags", [])}
        return [(a, r, dict(tags)) for r in resources for a in ("ecr:CreateRepository", "ecr:TagResource")]
    raise KeyError(f"no authorization table for ecr:{operation}")


def ec2_arn(resource: str, region: str = REGION, account: str = ACCOUNT) -> str:
    return f"arn:aws:ec2:{region}:{account}:{resource}"


def run_instances(params: dict[str, Any], image_owner: str = "amazon", region: str = REGION) -> list[Authorization]:
    """RunInstances is authorized per resource it touches, each with its own condition keys."""
    tags = {spec["ResourceType"]: {t["Key"]: t["Value"] for t in spec["Tags"]} for spec in params["TagSpecifications"]}

    def tagged(kind: str) -> dict[str, str]:
        return {f"aws:RequestTag/{k}": v for k, v in tags.get(kind, {}).items()}

    ebs = params["BlockDeviceMappings"][0]["Ebs"]
    market = params.get("InstanceMarketOptions", {}).get("MarketType", "on-demand")
    found: list[Authorization] = [
        (
            "ec2:RunInstances",
            ec2_arn("instance/*", region),
            {
                **tagged("instance"),
                "ec2:InstanceType": params["InstanceType"],
                "ec2:MetadataHttpTokens": params["MetadataOptions"]["HttpTokens"],
                "ec2:InstanceMarketType": market,
            },
        ),
        (
            "ec2:RunInstances",
            ec2_arn("volume/*", region),
            {**tagged("volume"), "ec2:Encrypted": str(ebs["Encrypted"]).lower(), "ec2:VolumeType": ebs["VolumeType"]},
        ),
        ("ec2:RunInstances", ec2_arn(f"image/{params['ImageId']}", region, account=""), {"ec2:Owner": image_owner}),
        ("ec2:RunInstances", ec2_arn(f"subnet/{params.get('SubnetId', 'subnet-default')}", region), {}),
        ("ec2:RunInstances", ec2_arn("network-interface/*", region), {}),
        *[
            ("ec2:RunInstances", ec2_arn(f"security-group/{sg}", region), {})
            for sg in params.get("SecurityGroupIds", ["sg-default"])
        ],
        *[
            ("ec2:CreateTags", ec2_arn(f"{kind}/*", region), {**tagged(kind), "ec2:CreateAction": "RunInstances"})
            for kind in tags
        ],
    ]
    if "KeyName" in params:
        found.append(("ec2:RunInstances", ec2_arn(f"key-pair/{params['KeyName']}", region), {}))
    target = params.get("CapacityReservationSpecification", {}).get("CapacityReservationTarget")
    if target:
        found.append(
            ("ec2:RunInstances", ec2_arn(f"capacity-reservation/{target['CapacityReservationId']}", region), {})
        )
    if "IamInstanceProfile" in params:
        found.append(
            (
                "iam:PassRole",
                f"arn:aws:iam::{ACCOUNT}:role/neuron-ssp-instance",
                {"iam:PassedToService": "ec2.amazonaws.com"},
            )
        )
    return found


def _ec2(operation: str, p: dict[str, Any], lookup: TagsOf, region: str) -> list[Authorization]:
    if operation == "RunInstances":
        return run_instances(p, region=region)
    if operation in ("DescribeInstances", "DescribeImages", "DescribeCapacityReservations"):
        return [(f"ec2:{operation}", "*", {})]
    ids = p.get("InstanceIds") or [p.get("InstanceId")]
    if operation in ("TerminateInstances", "GetConsoleOutput"):
        return [
            (f"ec2:{operation}", arn, existing("aws:ResourceTag", arn, lookup))
            for arn in (ec2_arn(f"instance/{i}", region) for i in ids)
        ]
    if operation == "CreateTags":
        tags = {f"aws:RequestTag/{t['Key']}": t["Value"] for t in p["Tags"]}
        return [
            (
                "ec2:CreateTags",
                arn,
                {**existing("aws:ResourceTag", arn, lookup), **tags, "aws:TagKeys": [t["Key"] for t in p["Tags"]]},
            )
            for arn in (ec2_arn(f"instance/{i}", region) for i in p["Resources"])
        ]
    raise KeyError(f"no authorization table for ec2:{operation}")


def _ssm(operation: str, p: dict[str, Any], lookup: TagsOf, region: str) -> list[Authorization]:
    if operation in ("DescribeInstanceInformation", "GetCommandInvocation", "ListCommandInvocations"):
        return [(f"ssm:{operation}", "*", {})]
    if operation == "GetParameter":
        return [("ssm:GetParameter", f"arn:aws:ssm:{region}::parameter{p['Name']}", {})]
    if operation == "SendCommand":
        instances = [ec2_arn(f"instance/{i}", region) for i in p["InstanceIds"]]
        return [
            ("ssm:SendCommand", f"arn:aws:ssm:{region}::document/{p['DocumentName']}", {}),
            *[("ssm:SendCommand", arn, existing("ssm:resourceTag", arn, lookup)) for arn in instances],
        ]
    raise KeyError(f"no authorization table for ssm:{operation}")


def _s3(operation: str, p: dict[str, Any], lookup: TagsOf, region: str) -> list[Authorization]:
    if operation == "ListObjectsV2":
        return [("s3:ListBucket", f"arn:aws:s3:::{p['Bucket']}", {"s3:prefix": p.get("Prefix", "")})]
    if operation in ("GetObject", "PutObject"):
        return [(f"s3:{operation}", f"arn:aws:s3:::{p['Bucket']}/{p['Key']}", {})]
    raise KeyError(f"no authorization table for s3:{operation}")
