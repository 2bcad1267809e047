"""Import a Neuron library's modules, or say (field, value, rule, fix) what is missing and how to install it."""

from __future__ import annotations

import importlib
from types import ModuleType

from neuron_ssp.errors import Problem, RuntimeProblem


def import_library(modules: tuple[str, ...], field: str, value: str, library: str, install: str) -> list[ModuleType]:
    """The modules in order; a RuntimeProblem naming `library` and the fix when one does not import."""
    try:
        return [importlib.import_module(name) for name in modules]
    except ImportError as exc:
        raise RuntimeProblem(Problem(field, value, f"{library} does not import ({exc})", install)) from None
