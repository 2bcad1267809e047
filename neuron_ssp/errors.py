"""User-facing errors: every problem names the field, the value, the rule and the fix.

A user mistake must never surface as a traceback. Code raises `UsageError` (bad input, exit 2) or
`RuntimeProblem` (the world is not as needed, exit 1) carrying one or more `Problem`s; the CLI prints
them all at once.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the input, phrased so the user can fix it without reading code."""

    field: str
    value: Any
    rule: str
    fix: str

    def __str__(self) -> str:
        return f"{self.field} = {self.value!r}: {self.rule}. Fix: {self.fix}"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["value"] = _jsonable(self.value)
        return data


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return repr(value)


class NeuronSSPError(Exception):
    """Base of the errors the CLI turns into a message and an exit code."""

    exit_code = 1

    def __init__(self, problems: list[Problem] | Problem):
        self.problems = [problems] if isinstance(problems, Problem) else list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


class UsageError(NeuronSSPError):
    """The user's input (config, flags, prompt) is invalid. Exit code 2."""

    exit_code = 2


class RuntimeProblem(NeuronSSPError):
    """Input is fine but something at run time is missing or failed. Exit code 1."""

    exit_code = 1
