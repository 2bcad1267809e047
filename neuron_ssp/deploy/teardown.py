"""Terminate deployments (one by name, or all of ours) and wait until they stop costing money."""

from __future__ import annotations

from typing import Any

from neuron_ssp.deploy.errors import aws_errors
from neuron_ssp.deploy.inventory import Deployment
from neuron_ssp.deploy.progress import Progress
from neuron_ssp.deploy.waiting import Pacing, wait_until


def terminate(
    ec2: Any, region: str, deployments: list[Deployment], *, wait: bool, pacing: Pacing, progress: Progress
) -> None:
    ids = [d.instance_id for d in deployments]
    if not ids:
        return
    with aws_errors("ec2", region=region):
        ec2.terminate_instances(InstanceIds=ids)
    if not wait:
        return

    def check() -> tuple[bool, str]:
        with aws_errors("ec2", region=region):
            reservations = ec2.describe_instances(InstanceIds=ids)["Reservations"]
        states = [i["State"]["Name"] for r in reservations for i in r["Instances"]]
        done = sum(s == "terminated" for s in states)
        return done == len(ids), f"{done}/{len(ids)} terminated"

    wait_until(
        "terminating",
        check,
        timeout_s=pacing.running_timeout_s,
        pacing=pacing,
        progress=progress,
        fix="check the EC2 console; termination normally takes a minute or two",
    )
