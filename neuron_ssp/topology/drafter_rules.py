"""Which backend runs which EAGLE drafter (issue 42, 43).

eagle (EAGLE-1) runs only inside NxD Inference's fused speculation: the torch backend never drafts with it.
eagle3 and ngram+eagle3 are drafted on the host by our loop from the target's hidden states (drafters/eagle.py,
drafters/combined.py); ngram+eagle3 is torch-only. What is not built yet is refused here, before anything loads.
"""

from __future__ import annotations

from neuron_ssp.config import Config
from neuron_ssp.errors import Problem
from neuron_ssp.topology.report import ValidationReport


def check_drafter(config: Config, report: ValidationReport) -> None:
    drafter = config.speculation.drafter
    if config.platform.backend == "torch":
        report.errors.extend(_torch_problems(drafter))
    elif drafter == "ngram+eagle3":  # eagle and eagle3 on Neuron: topology/head_rules.py, per library and SDK
        report.errors.append(_neuron_problem(drafter))


def _torch_problems(drafter: str) -> list[Problem]:
    if drafter == "eagle":
        return [
            Problem(
                "speculation.drafter",
                drafter,
                "EAGLE-1 heads run only inside NxD Inference's fused speculation; the torch backend drafts with "
                "EAGLE-3 heads",
                "use drafter: eagle3 with an EAGLE-3 head, or platform.backend: neuron with neuron.library: nxdi "
                "and speculation.engine: fused",
            )
        ]
    return []


def _neuron_problem(drafter: str) -> Problem:
    return Problem(
        "speculation.drafter",
        drafter,
        "the combined drafter (prompt lookup + EAGLE-3 head) runs on the torch backend only",
        "use drafter: eagle3 on Neuron, or platform.backend: torch",
    )
