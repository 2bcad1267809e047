"""AWS errors -> our Problems, so a failed deploy says what to change instead of dumping botocore.

Each known error code gets a rule and a fix written for the person at the keyboard: capacity errors
point at other Availability Zones and Capacity Blocks, permission errors name the IAM action and the
policy file that grants it, bad ids name the flag to correct.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from neuron_ssp.errors import NeuronSSPError, Problem, RuntimeProblem, UsageError

OPERATOR_POLICY = "deploy/iam/operator-policy.json"
INSTANCE_ROLE_POLICY = "deploy/iam/instance-role-policy.json"
PERMISSION_CODES = frozenset(
    {
        "UnauthorizedOperation",
        "AccessDenied",
        "AccessDeniedException",
        "UnauthorizedAccess",
    }
)
CREDENTIAL_CODES = frozenset(
    {
        "AuthFailure",
        "InvalidClientTokenId",
        "ExpiredToken",
        "ExpiredTokenException",
        "RequestExpired",
        "SignatureDoesNotMatch",
        "UnrecognizedClientException",
    }
)
_BAD_INPUT: dict[str, tuple[str, str]] = {
    # code -> (flag that carries the value, what to do)
    "InvalidSubnetID.NotFound": ("--subnet-id", "pass a subnet of this region (aws ec2 describe-subnets)"),
    "InvalidSubnetID.Malformed": ("--subnet-id", "subnet ids look like subnet-0123456789abcdef0"),
    "InvalidGroup.NotFound": ("--security-group-id", "pass a security group of the subnet's VPC"),
    "InvalidGroupId.Malformed": ("--security-group-id", "security group ids look like sg-0123456789abcdef0"),
    "InvalidKeyPair.NotFound": (
        "--key-name",
        "create the key pair in this region or leave --key-name out (SSM needs no SSH key)",
    ),
    "InvalidAMIID.NotFound": ("--ami", "the AMI is not visible in this region; use --ami pinned"),
    "InvalidAMIID.Malformed": ("--ami", "AMI ids look like ami-0123456789abcdef0, or use --ami pinned"),
    "InvalidCapacityReservationId.NotFound": (
        "--capacity-reservation-id/--capacity-block-id",
        "pass a reservation of this region (aws ec2 describe-capacity-reservations)",
    ),
    "InvalidCapacityReservationId.Malformed": (
        "--capacity-reservation-id/--capacity-block-id",
        "reservation ids look like cr-0123456789abcdef0",
    ),
    "InvalidInstanceID.NotFound": ("instance", "run `neuron-ssp deploy list` to see what exists"),
    "NoSuchBucket": ("s3 uri", "create the bucket in this account or fix the bucket name"),
}


_IAM_ACTION_OF = {"ListObjectsV2": "ListBucket"}  # API operations whose IAM action has another name


class AwsUnreachable(RuntimeProblem):
    """The request may or may not have reached AWS (connection lost, timeout)."""


def translatable() -> tuple[type[BaseException], ...]:
    """The botocore failures that are the world's doing (refused, unreachable, no credentials).

    Anything else (e.g. ParamValidationError) is a bug of ours and keeps its traceback.
    """
    from botocore import exceptions as bx

    return (
        bx.ClientError,
        bx.NoCredentialsError,
        bx.PartialCredentialsError,
        bx.NoRegionError,
        bx.ConnectionError,
        bx.HTTPClientError,
    )


def translate(exc: BaseException, service: str, **context: Any) -> NeuronSSPError:
    """Turn one of `translatable()` into our error; `context` (region, instance_type, ...) fills in."""
    from botocore import exceptions as bx

    if isinstance(exc, bx.ClientError):
        return _from_client_error(exc, service, context)
    if isinstance(exc, (bx.NoCredentialsError, bx.PartialCredentialsError)):
        return UsageError(
            Problem(
                "aws credentials",
                None,
                "no AWS credentials were found",
                "run `aws configure` or `aws sso login`, or set AWS_PROFILE",
            )
        )
    if isinstance(exc, bx.NoRegionError):
        return UsageError(
            Problem("--region", None, "no AWS region given", "pass --region (e.g. us-east-1) or set AWS_REGION")
        )
    return AwsUnreachable(
        Problem(
            f"{service} endpoint",
            str(exc),
            "AWS could not be reached",
            "check the network / proxy and the region name, then retry",
        )
    )


@contextmanager
def aws_errors(service: str, **context: Any) -> Iterator[None]:
    """Run AWS calls; re-raise AWS failures as our errors (no botocore traceback reaches the user)."""
    try:
        yield
    except translatable() as exc:
        raise translate(exc, service, **context) from None


def error_code(exc: BaseException) -> str:
    """The AWS error code of a ClientError ('' for anything else)."""
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


def _from_client_error(exc: Any, service: str, context: dict[str, Any]) -> NeuronSSPError:
    code = error_code(exc)
    message = str(exc.response.get("Error", {}).get("Message", ""))
    operation = exc.operation_name
    region = context.get("region", "?")
    if code == "InsufficientInstanceCapacity":
        return RuntimeProblem(insufficient_capacity(context.get("instance_type", "?"), region, message))
    if code in ("InstanceLimitExceeded", "VcpuLimitExceeded"):
        family = "Trn" if str(context.get("instance_type", "")).startswith("trn") else "Inf"
        return RuntimeProblem(
            Problem(
                "service quota",
                context.get("instance_type"),
                f"the account's vCPU quota is too low ({message})",
                f"request 'Running On-Demand {family} instances' in Service Quotas ({region}): "
                "trn1.32xlarge needs 128 vCPUs, inf2.48xlarge 192; or use a Capacity Block",
            )
        )
    if code in PERMISSION_CODES:
        return RuntimeProblem(permission_problem(service, operation, message, context))
    if code in CREDENTIAL_CODES:
        return UsageError(
            Problem(
                "aws credentials",
                code,
                f"AWS rejected the credentials: {message}",
                "refresh them (`aws sso login`, new session token) and retry",
            )
        )
    if code in _BAD_INPUT:
        flag, fix = _BAD_INPUT[code]
        return UsageError(Problem(flag, message, f"AWS rejected the value ({code})", fix))
    if code == "InvalidParameterValue" and "iamInstanceProfile" in message:
        return UsageError(
            Problem(
                "--instance-profile",
                context.get("instance_profile"),
                f"AWS rejected the instance profile: {message}",
                f"pass an instance profile name/ARN whose role has {INSTANCE_ROLE_POLICY}",
            )
        )
    return RuntimeProblem(
        Problem(
            f"{service}:{operation}",
            code or "error",
            message or str(exc),
            "read the AWS message above; fix the named parameter and retry",
        )
    )


def insufficient_capacity(instance_type: str, region: str, message: str = "") -> Problem:
    """No capacity for the type in the chosen AZ: say where else to look, and about Capacity Blocks."""
    return Problem(
        "instance_type",
        instance_type,
        f"AWS has no free {instance_type} capacity in {region} right now" + (f" ({message})" if message else ""),
        "retry later, or launch into another Availability Zone with --subnet-id (list the AZs that offer it: "
        "aws ec2 describe-instance-type-offerings --location-type availability-zone "
        f"--filters Name=instance-type,Values={instance_type} --region {region}), or buy a Capacity Block "
        "(aws ec2 describe-capacity-block-offerings) and pass --capacity-block-id",
    )


def permission_problem(service: str, operation: str, message: str, context: dict[str, Any]) -> Problem:
    """Name the IAM action that was refused and the policy in this repo that grants it."""
    action = f"{service}:{_IAM_ACTION_OF.get(operation, operation)}"
    extra = ""
    if operation == "RunInstances":
        extra = " (RunInstances with tags also needs ec2:CreateTags; with --instance-profile, iam:PassRole)"
    decode = (
        " Decode the details with `aws sts decode-authorization-message --encoded-message ...`."
        if "Encoded authorization failure message" in message
        else ""
    )
    return Problem(
        "permissions",
        action,
        f"your AWS identity may not call {action}{extra}",
        f"attach {OPERATOR_POLICY} (it grants {action}) to your user/role, or ask an administrator.{decode}",
    )
