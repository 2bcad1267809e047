"""Run a shell command on a deployment through SSM and bring its full output back.

`get_command_invocation` returns only the first 24,000 characters of stdout, so when an S3 location is
known the agent writes stdout/stderr there (`OutputS3BucketName`/`OutputS3KeyPrefix`) and we download
them; without one, short commands (status, log tails) read the inline output and say if it was cut.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Any

from neuron_ssp.deploy.errors import INSTANCE_ROLE_POLICY, aws_errors, error_code, translatable, translate
from neuron_ssp.deploy.inventory import Deployment
from neuron_ssp.deploy.progress import Progress
from neuron_ssp.deploy.userdata import ENV_FILE, READY, STATUS_FILE
from neuron_ssp.deploy.waiting import Pacing, wait_until
from neuron_ssp.errors import Problem, UsageError

INLINE_LIMIT = 24_000
NOT_READY_EXIT = 75
# GetCommandInvocation's final statuses (its enum also has Pending, InProgress, Delayed and Cancelling,
# which is on its way to Cancelled, not final).
FINAL_STATUSES = frozenset({"Success", "Failed", "Cancelled", "TimedOut"})


@dataclass(frozen=True)
class S3Location:
    bucket: str
    prefix: str

    @classmethod
    def parse(cls, uri: str, flag: str = "--output-s3-uri") -> S3Location:
        match = re.match(r"^s3://([a-z0-9][a-z0-9.-]{1,61}[a-z0-9])/?(.*)$", uri or "")
        if not match:
            raise UsageError(Problem(flag, uri, "not an s3://bucket/prefix URI", "write it as s3://my-bucket/runs"))
        return cls(match.group(1), match.group(2).strip("/"))

    def key_prefix(self, command_id: str, instance_id: str) -> str:
        """Where the SSM agent puts the output: <prefix>/<command-id>/<instance-id>/<plugin>/..."""
        return "/".join(p for p in (self.prefix, command_id, instance_id) if p) + "/"


@dataclass(frozen=True)
class CommandResult:
    command_id: str
    status: str
    exit_code: int
    stdout: str
    stderr: str
    truncated: bool


def bash_commands(argv: list[str] | str, require_ready: bool = True) -> list[str]:
    """AWS-RunShellScript `commands`: bash in the bootstrap venv; refused until the bootstrap is done.

    A list is the user's argv, passed through verbatim (quoted); a str is a shell snippet of ours.
    """
    user = argv if isinstance(argv, str) else shlex.join(argv)
    ready = (
        (
            f'if [ "$(cat {STATUS_FILE} 2>/dev/null)" != {READY} ]; then echo "bootstrap not finished: '
            f'$(cat {STATUS_FILE} 2>/dev/null || echo not started); see neuron-ssp deploy logs" >&2; '
            f"exit {NOT_READY_EXIT}; fi; . {ENV_FILE}; "
        )
        if require_ready
        else ""
    )
    return [f"exec bash -c {shlex.quote('set -eo pipefail; ' + ready + user)}"]


def run_remote(
    ssm: Any,
    s3: Any,
    deployment: Deployment,
    commands: list[str],
    *,
    output: S3Location | None,
    timeout_s: int,
    pacing: Pacing,
    progress: Progress,
    what: str,
) -> CommandResult:
    """Send, wait with a spinner, fetch the output. Never raises for a non-zero remote exit code."""
    command_id = send_shell(ssm, deployment, commands, output=output, timeout_s=timeout_s, what=what)
    invocation: dict[str, Any] = {}

    def check() -> tuple[bool, str]:
        invocation.update(read_invocation(ssm, command_id, deployment))
        return invocation["Status"] in FINAL_STATUSES, invocation["Status"]

    wait_until(
        f"{what} on {deployment.name}",
        check,
        timeout_s=timeout_s + 600,
        pacing=pacing,
        progress=progress,
        fix=f"aws ssm list-command-invocations --command-id {command_id} --details",
    )
    stdout, stderr = invocation.get("StandardOutputContent", ""), invocation.get("StandardErrorContent", "")
    truncated = len(stdout) >= INLINE_LIMIT
    if output:
        fetched = fetch_output(s3, output, command_id, deployment)
        if fetched is not None:
            stdout, stderr, truncated = *fetched, False
        else:
            progress.warn(
                f"no output in s3://{output.bucket}/{output.key_prefix(command_id, '')} — "
                f"the instance role needs s3:PutObject there ({INSTANCE_ROLE_POLICY})"
            )
    return CommandResult(
        command_id, invocation["Status"], int(invocation.get("ResponseCode", -1)), stdout, stderr, truncated
    )


def run_snippet(
    ssm: Any,
    s3: Any,
    deployment: Deployment,
    snippet: str,
    *,
    output: S3Location | None,
    pacing: Pacing,
    progress: Progress,
    what: str,
) -> CommandResult:
    """A short shell snippet of ours (status, log tail): allowed before the bootstrap is ready, 60 s at most."""
    commands = bash_commands(snippet, require_ready=False)
    return run_remote(
        ssm, s3, deployment, commands, output=output, timeout_s=60, pacing=pacing, progress=progress, what=what
    )


def send_shell(
    ssm: Any, deployment: Deployment, commands: list[str], *, output: S3Location | None, timeout_s: int, what: str
) -> str:
    """Start AWS-RunShellScript on the deployment; returns the command id."""
    request: dict[str, Any] = {
        "InstanceIds": [deployment.instance_id],
        "DocumentName": "AWS-RunShellScript",
        "Parameters": {"commands": commands, "executionTimeout": [str(timeout_s)]},
        "TimeoutSeconds": 600,
        "Comment": f"neuron-ssp {what}"[:100],
    }
    if output:
        request.update(OutputS3BucketName=output.bucket, OutputS3KeyPrefix=output.prefix)
    with aws_errors("ssm", region=deployment.region):
        return str(ssm.send_command(**request)["Command"]["CommandId"])


def read_invocation(ssm: Any, command_id: str, deployment: Deployment) -> dict[str, Any]:
    """The command's invocation so far (Status 'Pending' while SSM does not know it yet)."""
    try:
        return dict(ssm.get_command_invocation(CommandId=command_id, InstanceId=deployment.instance_id))
    except translatable() as exc:
        if error_code(exc) == "InvocationDoesNotExist":  # for a moment after send_command
            return {"Status": "Pending"}
        raise translate(exc, "ssm", region=deployment.region) from None


def fetch_output(s3: Any, output: S3Location, command_id: str, deployment: Deployment) -> tuple[str, str] | None:
    """Concatenate the agent's stdout/stderr objects; None when it uploaded nothing."""
    prefix = output.key_prefix(command_id, deployment.instance_id)
    keys: list[str] = []
    with aws_errors("s3", region=deployment.region):
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=output.bucket, Prefix=prefix):
            keys.extend(obj["Key"] for obj in page.get("Contents", []))
    if not keys:
        return None
    streams = {"stdout": "", "stderr": ""}
    for key in sorted(keys):
        stream = key.rsplit("/", 1)[-1]
        if stream in streams:
            with aws_errors("s3", region=deployment.region):
                streams[stream] += (
                    s3.get_object(Bucket=output.bucket, Key=key)["Body"].read().decode("utf-8", "replace")
                )
    return streams["stdout"], streams["stderr"]


def ssm_ping_status(ssm: Any, instance_id: str, region: str) -> str:
    """'Online', 'ConnectionLost', ... or 'not registered' (the agent has not checked in yet)."""
    with aws_errors("ssm", region=region):
        info = ssm.describe_instance_information(Filters=[{"Key": "InstanceIds", "Values": [instance_id]}])[
            "InstanceInformationList"
        ]
    return info[0]["PingStatus"] if info else "not registered"
