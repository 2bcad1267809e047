"""Capacity Reservations and Capacity Blocks: check the reservation fits, then target it.

trn1.32xlarge is often only to be had through a Capacity Block. A block must be `active`, match the
instance type, and its instance must launch in the block's Availability Zone with
`InstanceMarketOptions={'MarketType': 'capacity-block'}`. The two kinds end differently (EC2 User
Guide, "Work with Capacity Blocks"): AWS starts terminating a Capacity Block's instances 30 minutes
before the block ends, while an On-Demand Capacity Reservation's end leaves its instances running,
billed at the On-Demand rate.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from neuron_ssp.deploy.errors import aws_errors
from neuron_ssp.errors import Problem, UsageError

BLOCK_RECLAIM_LEAD = timedelta(minutes=30)  # Capacity Block instances are terminated from end - 30 min


@dataclass(frozen=True)
class CapacityTarget:
    reservation_id: str
    is_block: bool

    @property
    def flag(self) -> str:
        return "--capacity-block-id" if self.is_block else "--capacity-reservation-id"


@dataclass(frozen=True)
class Reservation:
    reservation_id: str
    instance_type: str
    availability_zone: str
    state: str
    available: int
    is_block: bool
    end: datetime | None

    @property
    def reclaim_at(self) -> datetime | None:
        """When AWS starts terminating this reservation's instances (only Capacity Blocks do)."""
        return self.end - BLOCK_RECLAIM_LEAD if self.is_block and self.end is not None else None


def describe_reservation(ec2: Any, target: CapacityTarget, region: str) -> Reservation:
    with aws_errors("ec2", region=region):
        found = ec2.describe_capacity_reservations(CapacityReservationIds=[target.reservation_id])
    r = found["CapacityReservations"][0]
    return Reservation(
        r["CapacityReservationId"],
        r["InstanceType"],
        r["AvailabilityZone"],
        r["State"],
        int(r.get("AvailableInstanceCount", 0)),
        r.get("ReservationType") == "capacity-block",
        r.get("EndDate"),
    )


def check_reservation(
    reservation: Reservation, target: CapacityTarget, instance_type: str, instance_end: datetime
) -> list[str]:
    """Raise when the reservation cannot take this launch; return warnings for what merely surprises."""
    problems = []
    if reservation.instance_type != instance_type:
        problems.append(
            Problem(
                target.flag,
                reservation.reservation_id,
                f"the reservation is for {reservation.instance_type}, the config wants {instance_type}",
                "pass a reservation for the config's instance type",
            )
        )
    if reservation.is_block != target.is_block:
        right = "--capacity-block-id" if reservation.is_block else "--capacity-reservation-id"
        problems.append(
            Problem(
                target.flag,
                reservation.reservation_id,
                "this flag does not match the reservation's kind",
                f"pass it with {right}",
            )
        )
    if reservation.state != "active":
        problems.append(
            Problem(
                target.flag,
                reservation.reservation_id,
                f"the reservation is '{reservation.state}', not 'active'",
                "wait until its start time (aws ec2 describe-capacity-reservations), then launch",
            )
        )
    elif reservation.available < 1:
        problems.append(
            Problem(
                target.flag,
                reservation.reservation_id,
                "the reservation has no free instance slot",
                "tear down what runs in it (`neuron-ssp deploy list`) or use another one",
            )
        )
    if problems:
        raise UsageError(problems)
    return end_warnings(reservation, instance_end)


def end_warnings(reservation: Reservation, instance_end: datetime) -> list[str]:
    """What the reservation's end does to an instance meant to run until `instance_end` (the TTL)."""
    if reservation.end is None:
        return []
    if reservation.reclaim_at is not None:
        if reservation.reclaim_at >= instance_end:
            return []
        return [
            f"the Capacity Block ends at {reservation.end:%Y-%m-%d %H:%M} UTC, before the TTL: AWS starts "
            f"terminating its instances 30 minutes earlier, at {reservation.reclaim_at:%Y-%m-%d %H:%M} UTC"
        ]
    if reservation.end >= instance_end:
        return []
    return [
        f"the Capacity Reservation ends at {reservation.end:%Y-%m-%d %H:%M} UTC, before the TTL: the instance "
        "keeps running after it, billed at the On-Demand rate, until the TTL or a teardown"
    ]


def run_instances_fields(target: CapacityTarget, reservation: Reservation, subnet_id: str | None) -> dict[str, Any]:
    """The run_instances parameters that place the instance into the reservation."""
    fields: dict[str, Any] = {
        "CapacityReservationSpecification": {
            "CapacityReservationTarget": {"CapacityReservationId": target.reservation_id}
        },
    }
    if target.is_block:
        fields["InstanceMarketOptions"] = {"MarketType": "capacity-block"}
    if subnet_id is None:
        fields["Placement"] = {"AvailabilityZone": reservation.availability_zone}
    return fields
