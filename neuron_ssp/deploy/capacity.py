"""Capacity Reservations and Capacity Blocks: check the reservation fits, then target it.

trn1.32xlarge is often only to be had through a Capacity Block. A block must be `active`, match the
instance type, and its instance must launch in the block's Availability Zone with
`InstanceMarketOptions={'MarketType': 'capacity-block'}`; AWS reclaims the instance at the block's end.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from neuron_ssp.deploy.errors import aws_errors
from neuron_ssp.errors import Problem, UsageError


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
    if reservation.end is not None and reservation.end < instance_end:
        return [
            f"the reservation ends at {reservation.end:%Y-%m-%d %H:%M %Z}, before the TTL; AWS will "
            "terminate the instance then"
        ]
    return []


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
