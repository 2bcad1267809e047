"""When a deployment ends, and how to move that.

The instance carries its end in the `neuron-ssp:expires-at` tag. The bootstrap installs a systemd timer
that, one minute after every boot and every 5 minutes, reads that tag from instance metadata and shuts
the instance down (= terminates it) once it has passed: the expiry survives reboots and `shutdown -c`,
and retagging moves it without touching the instance.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from neuron_ssp.deploy import tags
from neuron_ssp.deploy.errors import aws_errors
from neuron_ssp.deploy.inventory import Deployment
from neuron_ssp.errors import Problem, UsageError

MAX_HOURS = 168  # one week
CHECK_INTERVAL_MINUTES = 5  # neuron-ssp-expiry.timer's OnUnitActiveSec


def hours_problem(flag: str, hours: float) -> Problem | None:
    if 0 < hours <= MAX_HOURS:
        return None
    return Problem(
        flag,
        hours,
        f"must be > 0 and at most {MAX_HOURS} (one week)",
        "pick the hours you need; the instance terminates itself after them",
    )


def extend(ec2: Any, deployment: Deployment, hours: float, now: datetime) -> datetime:
    """Move the deployment's end to `hours` from `now` (by its tag); returns the new end."""
    problem = hours_problem("--hours", hours)
    if problem:
        raise UsageError(problem)
    expires_at = now + timedelta(hours=hours)
    with aws_errors("ec2", region=deployment.region):
        ec2.create_tags(
            Resources=[deployment.instance_id],
            Tags=[{"Key": tags.EXPIRES_KEY, "Value": tags.expiry_text(expires_at)}],
        )
    return expires_at
