"""Poll AWS until something is true, reporting each poll: launches take minutes and must look alive.

Sleep and clock are injectable (`Pacing`) so tests run the same loops without waiting.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from neuron_ssp.deploy.progress import Progress
from neuron_ssp.errors import Problem, RuntimeProblem


@dataclass(frozen=True)
class Pacing:
    interval_s: float = 10.0
    running_timeout_s: float = 15 * 60
    ssm_online_timeout_s: float = 20 * 60
    bootstrap_timeout_s: float = 60 * 60  # pip install + ~150 GB of weights from S3
    bootstrap_interval_s: float = 30.0  # each poll is an SSM command: poll less often than EC2
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic


Check = Callable[[], "tuple[bool, str]"]


def wait_until(what: str, check: Check, *, timeout_s: float, pacing: Pacing, progress: Progress, fix: str) -> str:
    """Call `check` until it returns (True, detail); raise RuntimeProblem after `timeout_s`.

    `check` may raise to abort (e.g. the instance terminated). Returns the last detail.
    """
    start = pacing.clock()
    with progress.waiting(what) as show:
        while True:
            done, detail = check()
            show(detail)
            if done:
                break
            waited = pacing.clock() - start
            if waited >= timeout_s:
                raise RuntimeProblem(Problem(what, detail, f"not reached after {waited / 60:.0f} min", fix))
            pacing.sleep(pacing.interval_s)
    progress.done(what)
    return detail
