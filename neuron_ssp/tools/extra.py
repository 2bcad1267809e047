"""The optional `tools` extra (matplotlib, scipy, ruamel.yaml): only some tool commands need it.

Generating, serving and deploying run without it, so these packages are imported where a command
uses them, and a command that needs one checks before it loads a model: a missing package is a
message saying what to install, not a traceback after minutes of measuring.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from neuron_ssp.errors import Problem, RuntimeProblem

INSTALL_TOOLS = "pip install 'neuron-ssp[tools]'"


def import_extra(module: str, needed_for: str) -> ModuleType:
    """`module` imported, or a RuntimeProblem naming the package, what needs it and how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        package = module.split(".")[0]
        raise RuntimeProblem(
            Problem(
                needed_for,
                package,
                f"needs the package {package}, which is not installed (the optional 'tools' extra)",
                f"install the tools extra: {INSTALL_TOOLS} (./setup.sh dev installs it)",
            )
        ) from None


def scipy_stats() -> ModuleType:
    """scipy.stats: eval's intervals and tests, and --lossless's permutation test."""
    return import_extra("scipy.stats", "eval")
