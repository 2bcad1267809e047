r"""What botocore's ParamValidator leaves out, checked from the same service model: enums, patterns, maxima.

ParamValidator checks types, required members and minimums (botocore/validate.py); a made-up
`PredefinedMetricType` or an `ml.bogus.huge` instance type passes it, and AWS would refuse them. Here
every string is held against its shape's `enum` and `pattern`, every string and list against its `max`
length and every number against its `max`. Patterns are Java regular expressions matched against the
whole value, as the services' validators do: the `regex` module reads their Unicode classes (`\p{L}`),
Java's ASCII-only `\p{Print}` and UTF-16 surrogate ranges are translated first. A pattern this checker
cannot compile is an error, never a silent pass.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import regex

# Java spells the supplementary planes as a range of UTF-16 surrogate pairs; Python as code points.
_SURROGATE_RANGE = r"\uD800\uDC00-\uDBFF\uDFFF"
_JAVA_PRINT = r"\p{Print}"  # POSIX class, US-ASCII only in Java (no UNICODE_CHARACTER_CLASS flag)


def request_problems(operation_model: Any, params: dict[str, Any]) -> list[str]:
    """Every enum, pattern and maximum the request breaks, as 'Path: what'."""
    problems: list[str] = []
    _check(operation_model.input_shape, params, operation_model.name, problems)
    return problems


def _check(shape: Any, value: Any, path: str, problems: list[str]) -> None:
    if shape is None or value is None:
        return
    kind = shape.type_name
    meta = shape.metadata
    if kind == "structure" and isinstance(value, dict):
        for name, member in value.items():
            if name in shape.members:
                _check(shape.members[name], member, f"{path}.{name}", problems)
    elif kind == "list" and isinstance(value, (list, tuple)):
        _at_most(len(value), meta.get("max"), path, "items", problems)
        for i, item in enumerate(value):
            _check(shape.member, item, f"{path}[{i}]", problems)
    elif kind == "map" and isinstance(value, dict):
        for key, item in value.items():
            _check(shape.key, key, f"{path} key", problems)
            _check(shape.value, item, f"{path}[{key}]", problems)
    elif kind == "string" and isinstance(value, str):
        enum = shape.enum
        if enum and value not in enum:
            problems.append(f"{path}: {value!r} is not one of the {len(enum)} values of {shape.name}")
        if "pattern" in meta and not _pattern(meta["pattern"]).fullmatch(value):
            problems.append(f"{path}: {value!r} does not match {shape.name}'s pattern {meta['pattern']!r}")
        _at_most(len(value), meta.get("max"), path, "characters", problems)
    elif (
        kind in ("integer", "long", "float", "double")
        and isinstance(value, (int, float))
        and value > meta.get("max", value)
    ):
        problems.append(f"{path}: {value} is above {shape.name}'s maximum {meta['max']}")


def _at_most(size: int, maximum: int | None, path: str, unit: str, problems: list[str]) -> None:
    if maximum is not None and size > maximum:
        problems.append(f"{path}: {size} {unit}, at most {maximum} allowed")


@cache
def _pattern(pattern: str) -> regex.Pattern[str]:
    translated = pattern.replace(_SURROGATE_RANGE, r"\U00010000-\U0010FFFF").replace(_JAVA_PRINT, r"[\x20-\x7E]")
    return regex.compile(translated)
