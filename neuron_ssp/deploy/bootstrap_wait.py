"""Wait for the bootstrap's own verdict: SSM online only means the agent runs, not that the host is ready.

The bootstrap writes its step to STATUS_FILE, `ready` at the end, `failed: <step>` from its ERR trap.
Launch reads that file over SSM, one short command at a time, and on failure shows the log tail so the
user sees why before the instance is torn down.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from neuron_ssp.deploy.inventory import Deployment
from neuron_ssp.deploy.progress import Progress
from neuron_ssp.deploy.ssm_run import FINAL_STATUSES, bash_commands, read_invocation, run_snippet, send_shell
from neuron_ssp.deploy.userdata import FAILED_PREFIX, LOG_FILE, READY, STATUS_FILE
from neuron_ssp.deploy.waiting import Pacing, wait_until
from neuron_ssp.errors import NeuronSSPError, Problem, RuntimeProblem

LOG_TAIL_LINES = 30
STATUS_SNIPPET = f"cat {STATUS_FILE} 2>/dev/null || echo not-started"


class BootstrapFailed(RuntimeProblem):
    """The bootstrap's ERR trap ran: the status file says `failed: <step>`."""


class StatusProbe:
    """A `wait_until` check that keeps one status read in flight: send, then poll it until it ends."""

    def __init__(self, ssm: Any, deployment: Deployment) -> None:
        self.ssm = ssm
        self.deployment = deployment
        self.command_id: str | None = None
        self.status = "starting"

    def __call__(self) -> tuple[bool, str]:
        if self.command_id is None:
            commands = bash_commands(STATUS_SNIPPET, require_ready=False)
            self.command_id = send_shell(
                self.ssm, self.deployment, commands, output=None, timeout_s=60, what="bootstrap status"
            )
            return False, self.status
        invocation = read_invocation(self.ssm, self.command_id, self.deployment)
        if invocation["Status"] not in FINAL_STATUSES:
            return False, self.status
        self.command_id = None
        if invocation["Status"] == "Success":
            self.status = invocation.get("StandardOutputContent", "").strip() or "unknown"
        if self.status.startswith(FAILED_PREFIX):
            step = self.status.partition(":")[2].strip() or "?"
            raise BootstrapFailed(Problem("bootstrap", step, f"the bootstrap failed at step '{step}'", ""))
        return self.status == READY, self.status


def wait_bootstrap(ssm: Any, s3: Any, deployment: Deployment, pacing: Pacing, progress: Progress) -> None:
    """Return once the status file says `ready`; raise with the log tail when it says `failed`."""
    try:
        wait_until(
            f"{deployment.instance_id} bootstrap",
            StatusProbe(ssm, deployment),
            timeout_s=pacing.bootstrap_timeout_s,
            pacing=replace(pacing, interval_s=pacing.bootstrap_interval_s),
            progress=progress,
            fix=f"see how far it got: neuron-ssp deploy logs {deployment.name} --region {deployment.region} "
            "(--console if SSM cannot run commands); launch with --keep-on-failure to keep the instance for that",
        )
    except BootstrapFailed as failed:
        step = failed.problems[0].value
        raise RuntimeProblem(
            Problem(
                "bootstrap",
                step,
                f"the bootstrap failed at step '{step}'; the last lines of {LOG_FILE}:\n"
                + log_tail(ssm, s3, deployment, pacing, progress),
                "fix what the log names and launch again; --keep-on-failure keeps the instance to inspect "
                f"(neuron-ssp deploy logs {deployment.name})",
            )
        ) from None


def log_tail(ssm: Any, s3: Any, deployment: Deployment, pacing: Pacing, progress: Progress) -> str:
    """The bootstrap log's last lines, or why they could not be read (never raises: we are already failing)."""
    try:
        snippet = f"tail -n {LOG_TAIL_LINES} {LOG_FILE}"
        result = run_snippet(
            ssm, s3, deployment, snippet, output=None, pacing=pacing, progress=progress, what="bootstrap log"
        )
    except NeuronSSPError as exc:
        return f"  (could not read it: {exc.problems[0].rule})"
    lines = result.stdout.rstrip().splitlines() or ["(empty)"]
    return "\n".join(f"  | {line}" for line in lines)
