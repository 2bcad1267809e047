"""The tail of an endpoint's CloudWatch logs: the container's own words on why it did not start."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from neuron_ssp.deploy.errors import translatable
from neuron_ssp.deploy.sagemaker.errors import is_not_found, sagemaker_errors, translate_sagemaker


def log_group(endpoint: str) -> str:
    return f"/aws/sagemaker/Endpoints/{endpoint}"


def tail(logs: Any, endpoint: str, lines: int = 50, streams: int = 2, region: str = "?") -> list[str]:
    """The last `lines` events of the newest `streams` log streams (one per instance), oldest first.

    Returns [] when the group does not exist yet (the container never started).
    """
    group = log_group(endpoint)
    try:
        found = logs.describe_log_streams(logGroupName=group, orderBy="LastEventTime", descending=True, limit=streams)[
            "logStreams"
        ]
    except translatable() as exc:
        if is_not_found(exc):
            return []
        raise translate_sagemaker(exc, "logs", region=region) from None
    out: list[str] = []
    for stream in reversed(found):
        with sagemaker_errors("logs", region=region):
            events = logs.get_log_events(
                logGroupName=group, logStreamName=stream["logStreamName"], limit=lines, startFromHead=False
            )["events"]
        for event in events:
            stamp = datetime.fromtimestamp(event["timestamp"] / 1000, tz=timezone.utc)
            out.append(f"{stamp:%H:%M:%S} {stream['logStreamName']}: {event['message'].rstrip()}")
    return out[-lines:]
