"""SageMaker-side AWS errors -> Problems: the refused IAM action with the policy file that grants it,
the quota to request, the flag to correct. Everything else goes through the EC2 deploy's translator.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from neuron_ssp.deploy.errors import PERMISSION_CODES, error_code, translatable, translate
from neuron_ssp.errors import NeuronSSPError, Problem, RuntimeProblem, UsageError

SAGEMAKER_OPERATOR_POLICY = "deploy/iam/sagemaker-operator-policy.json"
EXECUTION_ROLE_POLICY = "deploy/iam/sagemaker-execution-role.json"
# API operations whose IAM action has another name (sagemaker-runtime signs as "sagemaker").
IAM_ACTION_OF = {"InvokeEndpointWithResponseStream": "InvokeEndpoint"}
NOT_FOUND_CODES = frozenset(
    {"ValidationException", "ObjectNotFoundException", "ResourceNotFoundException", "RepositoryNotFoundException"}
)
_QUOTA = re.compile(r"service limit '([^']+)'")


def iam_action(service_prefix: str, operation: str) -> str:
    return f"{service_prefix}:{IAM_ACTION_OF.get(operation, operation)}"


@contextmanager
def sagemaker_errors(service_prefix: str, **context: Any) -> Iterator[None]:
    """Like deploy.errors.aws_errors, with SageMaker's permission, quota and validation messages."""
    try:
        yield
    except translatable() as exc:
        raise translate_sagemaker(exc, service_prefix, **context) from None


def translate_sagemaker(exc: BaseException, service_prefix: str, **context: Any) -> NeuronSSPError:
    code = error_code(exc)
    response = getattr(exc, "response", None) or {}
    message = str(response.get("Error", {}).get("Message", ""))
    operation = getattr(exc, "operation_name", "?")
    region = context.get("region", "?")
    if code in PERMISSION_CODES:
        action = iam_action(service_prefix, operation)
        return RuntimeProblem(
            Problem(
                "permissions",
                action,
                f"your AWS identity may not call {action} ({message})",
                f"attach {SAGEMAKER_OPERATOR_POLICY} (it grants {action}) to your user/role, or ask an administrator",
            )
        )
    if code in ("ResourceLimitExceeded", "LimitExceededException"):
        match = _QUOTA.search(message)
        quota = match.group(1) if match else f"{context.get('instance_type', 'the instance type')} for endpoint usage"
        return RuntimeProblem(
            Problem(
                "service quota",
                quota,
                f"the account's SageMaker quota is too low ({message})",
                f"request '{quota}' in Service Quotas -> Amazon SageMaker ({region}) for at least "
                f"{context.get('instances', 'the --max')} instance(s), then retry",
            )
        )
    if code == "ValidationException" and "role" in message.lower() and "assum" in message.lower():
        return UsageError(
            Problem(
                "--role-arn",
                context.get("role_arn"),
                f"SageMaker cannot use the execution role: {message}",
                f"pass a role trusted by sagemaker.amazonaws.com with {EXECUTION_ROLE_POLICY}",
            )
        )
    return translate(exc, service_prefix, **context)


def is_not_found(exc: BaseException) -> bool:
    """SageMaker and Application Auto Scaling say 'not found' with a ValidationException."""
    code = error_code(exc)
    if code not in NOT_FOUND_CODES:
        return False
    message = str((getattr(exc, "response", None) or {}).get("Error", {}).get("Message", "")).lower()
    return (
        code != "ValidationException"
        or "could not find" in message
        or "no scalable target" in message
        or "no scaling policy" in message
        or "does not exist" in message
    )


def find_existing(describe: Callable[[], dict[str, Any]]) -> dict[str, Any] | None:
    """The description, or None when the service says the resource does not exist."""
    try:
        return describe()
    except translatable() as exc:
        if is_not_found(exc):
            return None
        raise
