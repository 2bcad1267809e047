"""The outcome of validating a config: every error and warning at once, and the load order.

Its own module because the rule modules (generic, engine, neuron) fill it and `validate` returns it:
inside `validate.py` the rules would import the module that imports them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from neuron_ssp.errors import Problem, UsageError


@dataclass
class ValidationReport:
    """Errors stop a deployment; warnings are legal but off the tested path (or cost speed)."""

    errors: list[Problem] = field(default_factory=list)
    warnings: list[Problem] = field(default_factory=list)
    load_order: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors

    def raise_if_invalid(self) -> None:
        if self.errors:
            raise UsageError(self.errors)

    def to_dict(self) -> dict[str, Any]:
        return {
            "valid": self.ok,
            "errors": [p.to_dict() for p in self.errors],
            "warnings": [p.to_dict() for p in self.warnings],
            "load_order": list(self.load_order),
        }
