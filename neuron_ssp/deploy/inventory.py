"""What this tool has launched, found by tag: state, uptime and the money it has cost so far.

Prices are the topology catalog's on-demand estimates for us-east-1: other regions differ, and
Capacity Blocks are paid up front at their own price.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from neuron_ssp.deploy import tags
from neuron_ssp.deploy.errors import aws_errors
from neuron_ssp.errors import Problem, UsageError
from neuron_ssp.topology import hourly_price_usd

LIVE_STATES = ("pending", "running", "stopping", "stopped", "shutting-down")


@dataclass(frozen=True)
class Deployment:
    name: str
    instance_id: str
    instance_type: str
    state: str
    region: str
    availability_zone: str
    launch_time: datetime
    tags: dict[str, str]

    @property
    def hourly_usd(self) -> float | None:
        return hourly_price_usd(self.instance_type)

    @property
    def expires_at(self) -> datetime | None:
        raw = self.tags.get(tags.EXPIRES_KEY)
        return datetime.strptime(raw, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc) if raw else None

    @property
    def output_s3_uri(self) -> str | None:
        return self.tags.get(tags.OUTPUT_KEY)

    def uptime_hours(self, now: datetime) -> float:
        return max(0.0, (now - self.launch_time).total_seconds() / 3600)

    def cost_so_far(self, now: datetime) -> float | None:
        """On-demand estimate; EC2 bills per second, stopped instances only for their volume."""
        price = self.hourly_usd
        return None if price is None else price * self.uptime_hours(now)

    def to_dict(self, now: datetime) -> dict[str, Any]:
        cost = self.cost_so_far(now)
        return {
            "name": self.name,
            "instance_id": self.instance_id,
            "instance_type": self.instance_type,
            "state": self.state,
            "region": self.region,
            "availability_zone": self.availability_zone,
            "launch_time": self.launch_time.isoformat(),
            "uptime_hours": round(self.uptime_hours(now), 3),
            "usd_per_hour": self.hourly_usd,
            "usd_so_far": None if cost is None else round(cost, 2),
            "expires_at": self.expires_at.isoformat() if self.expires_at else None,
            "config": self.tags.get(tags.CONFIG_KEY),
            "owner": self.tags.get(tags.OWNER_KEY),
        }


def format_usd(amount: float | None) -> str:
    return "unknown" if amount is None else f"${amount:,.2f}"


def list_deployments(
    ec2: Any, region: str, name: str | None = None, states: tuple[str, ...] = LIVE_STATES
) -> list[Deployment]:
    filters = [*tags.ours_filters(name), {"Name": "instance-state-name", "Values": list(states)}]
    found = []
    with aws_errors("ec2", region=region):
        for page in ec2.get_paginator("describe_instances").paginate(Filters=filters):
            for reservation in page["Reservations"]:
                found.extend(from_instance(i, region) for i in reservation["Instances"])
    return sorted(found, key=lambda d: (d.name, d.launch_time))


def find_deployment(ec2: Any, region: str, name: str) -> Deployment:
    """The live deployment called `name`; a UsageError listing the known names otherwise."""
    matches = list_deployments(ec2, region, name)
    if not matches:
        known = sorted({d.name for d in list_deployments(ec2, region)})
        raise UsageError(
            Problem(
                "NAME",
                name,
                f"no live deployment of that name in {region}",
                f"use one of: {', '.join(known)}" if known else "launch one with `neuron-ssp deploy launch`",
            )
        )
    if len(matches) > 1:
        ids = [d.instance_id for d in matches]
        raise UsageError(
            Problem(
                "NAME",
                name,
                f"several instances carry this name: {', '.join(ids)}",
                f"`neuron-ssp deploy teardown {name} --region {region}` terminates all of them",
            )
        )
    return matches[0]


def describe(ec2: Any, region: str, instance_id: str) -> Deployment:
    with aws_errors("ec2", region=region):
        reservations = ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]
    return from_instance(reservations[0]["Instances"][0], region)


def from_instance(instance: dict[str, Any], region: str) -> Deployment:
    instance_tags = tags.as_dict(instance.get("Tags"))
    launch_time = instance["LaunchTime"]
    if launch_time.tzinfo is None:
        launch_time = launch_time.replace(tzinfo=timezone.utc)
    return Deployment(
        name=instance_tags.get(tags.DEPLOYMENT_KEY, instance_tags.get(tags.NAME_KEY, "?")),
        instance_id=instance["InstanceId"],
        instance_type=instance["InstanceType"],
        state=instance["State"]["Name"],
        region=region,
        availability_zone=instance.get("Placement", {}).get("AvailabilityZone", "?"),
        launch_time=launch_time,
        tags=instance_tags,
    )
