"""The tags that mark what this tool launched; list, status and teardown find instances only by them."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from neuron_ssp.errors import Problem, UsageError

PROJECT = "neuron-ssp"
PROJECT_KEY = "Project"
NAME_KEY = "Name"
DEPLOYMENT_KEY = "neuron-ssp:deployment"
CONFIG_KEY = "neuron-ssp:config"
OWNER_KEY = "neuron-ssp:owner"
TTL_KEY = "neuron-ssp:ttl-hours"
EXPIRES_KEY = "neuron-ssp:expires-at"
OUTPUT_KEY = "neuron-ssp:output-s3-uri"
_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")


def check_deployment_name(name: str) -> str:
    if not _NAME.match(name):
        raise UsageError(
            Problem(
                "--name",
                name,
                "a deployment name is 1-63 lowercase letters, digits or '-'",
                "pick a name such as llama2-70b-trn1",
            )
        )
    return name


def launch_tags(
    *,
    deployment: str,
    config_name: str,
    owner: str,
    ttl_hours: float,
    expires_at: datetime,
    output_s3_uri: str | None,
) -> dict[str, str]:
    tags = {
        NAME_KEY: deployment,
        PROJECT_KEY: PROJECT,
        DEPLOYMENT_KEY: deployment,
        CONFIG_KEY: config_name[:256],
        OWNER_KEY: owner[:256],
        TTL_KEY: f"{ttl_hours:g}",
        EXPIRES_KEY: expiry_text(expires_at),
    }
    if output_s3_uri:
        tags[OUTPUT_KEY] = output_s3_uri[:256]
    return tags


def expiry_text(expires_at: datetime) -> str:
    """The expires-at tag's value: UTC, ISO 8601 (read by `date -d` on the instance)."""
    return expires_at.strftime("%Y-%m-%dT%H:%M:%SZ")


def tag_specifications(tags: dict[str, str]) -> list[dict[str, Any]]:
    """Tag the instance and its root volume at creation (one API call, no untagged window)."""
    pairs = [{"Key": k, "Value": v} for k, v in tags.items()]
    return [{"ResourceType": "instance", "Tags": pairs}, {"ResourceType": "volume", "Tags": pairs}]


def ours_filters(deployment: str | None = None) -> list[dict[str, Any]]:
    """describe_instances filters that select only instances launched by this tool."""
    filters = [
        {"Name": f"tag:{PROJECT_KEY}", "Values": [PROJECT]},
        {"Name": "tag-key", "Values": [DEPLOYMENT_KEY]},
    ]
    if deployment:
        filters.append({"Name": f"tag:{DEPLOYMENT_KEY}", "Values": [deployment]})
    return filters


def as_dict(aws_tags: list[dict[str, str]] | None) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in aws_tags or []}
