"""boto3 clients for one region, imported lazily: boto3 is the optional `deploy` extra."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from neuron_ssp.errors import Problem, UsageError

INSTALL_HINT = "pip install 'neuron-ssp[deploy]'"
_REGION = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d$")
_KMS_KEY = re.compile(  # key id, multi-Region key id, alias, or the ARN of a key or an alias
    r"^(arn:aws[a-z-]*:kms:[a-z0-9-]+:\d{12}:(key|alias)/[\w/-]+|alias/[\w/-]+|[0-9a-f-]{36}|mrk-[0-9a-f]{32})$"
)


def import_boto3() -> Any:
    """Import boto3 or explain how to install it (the deploy commands are an optional extra)."""
    try:
        import boto3
    except ImportError:
        raise UsageError(
            Problem(
                "boto3",
                None,
                "the deploy commands need boto3, which is not installed",
                f"install the deploy extra: {INSTALL_HINT}",
            )
        ) from None
    return boto3


def check_region(region: str | None) -> str:
    if not region:
        raise UsageError(
            Problem("--region", region, "no AWS region given", "pass --region (e.g. us-east-1) or set AWS_REGION")
        )
    if not _REGION.match(region):
        raise UsageError(
            Problem(
                "--region",
                region,
                "not an AWS region name",
                "use a region code such as us-east-1, us-west-2 or eu-west-1",
            )
        )
    return region


def kms_key_problem(kms_key: str, default: str) -> Problem | None:
    """A --kms-key that is no KMS key id, key ARN, alias or alias ARN; `default` says what leaving it out does."""
    if _KMS_KEY.match(kms_key):
        return None
    return Problem(
        "--kms-key",
        kms_key,
        "not a KMS key id, key ARN, alias or alias ARN",
        f"pass e.g. alias/my-key or arn:aws:kms:us-east-1:123456789012:key/<key-id>; leave it out to use {default}",
    )


def new_session() -> Any:
    """A boto3 session from the usual credential chain (env, profile, SSO)."""
    return import_boto3().session.Session()


@dataclass(frozen=True)
class AwsClients:
    """The four clients a deploy needs, all bound to one region."""

    region: str
    ec2: Any
    ssm: Any
    s3: Any
    sts: Any

    @classmethod
    def for_region(cls, region: str | None, session: Any = None) -> AwsClients:
        region = check_region(region)
        session = session if session is not None else new_session()  # says how to install boto3 if missing
        from botocore.config import Config

        config = Config(retries={"mode": "standard", "max_attempts": 5}, user_agent_extra="neuron-ssp-deploy")

        def client(name: str) -> Any:
            return session.client(name, region_name=region, config=config)

        return cls(region, client("ec2"), client("ssm"), client("s3"), client("sts"))
