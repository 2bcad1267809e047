"""Just enough IAM policy evaluation to test our policies by the requests they must allow and refuse.

Supported: Allow/Deny statements (an explicit Deny wins), `Action`/`Resource` with `*`/`?` wildcards,
the condition operators StringEquals/ArnEquals, StringLike/ArnLike and Bool (a missing key fails
the condition, as in IAM), and ForAllValues:StringLike over a multi-valued key (every value must match;
a missing key passes, as in IAM, which is why a policy should not rely on it alone). Anything else
(NotAction, other operators, ...IfExists) raises, so a policy that outgrows this evaluator fails its
tests instead of passing unexamined.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

_OPERATORS = {"StringEquals", "StringLike", "ArnEquals", "ArnLike", "Bool", "ForAllValues:StringLike"}


def load(path: Path, placeholders: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """The policy's statements, with its REPLACE-WITH-... placeholders filled in as a user would."""
    text = path.read_text()
    for placeholder, value in (placeholders or {}).items():
        text = text.replace(placeholder, value)
    statements = json.loads(text)["Statement"]
    for statement in statements:
        unknown = set(statement) - {"Sid", "Effect", "Action", "Resource", "Condition"}
        if unknown:
            raise ValueError(f"{statement.get('Sid')}: {sorted(unknown)} is beyond this evaluator")
    return statements


def allows(statements: list[dict[str, Any]], action: str, resource: str, context: dict[str, Any]) -> bool:
    """Would a request for `action` on `resource`, with these condition keys, be allowed?"""
    matching = [s for s in statements if _applies(s, action, resource, context)]
    return any(s["Effect"] == "Allow" for s in matching) and not any(s["Effect"] == "Deny" for s in matching)


def actions(statements: list[dict[str, Any]]) -> list[str]:
    return [a for s in statements if s["Effect"] == "Allow" for a in _listed(s["Action"])]


def grants_action(statements: list[dict[str, Any]], action: str) -> bool:
    """Is `action` allowed on at least some resource (whatever the conditions)?"""
    return any(_wildcard(pattern, action, ignore_case=True) for pattern in actions(statements))


def _applies(statement: dict[str, Any], action: str, resource: str, context: dict[str, Any]) -> bool:
    return (
        any(_wildcard(p, action, ignore_case=True) for p in _listed(statement["Action"]))
        and any(_wildcard(p, resource) for p in _listed(statement["Resource"]))
        and _conditions_hold(statement.get("Condition", {}), context)
    )


def _conditions_hold(conditions: dict[str, dict[str, Any]], context: dict[str, Any]) -> bool:
    by_key = {k.lower(): v for k, v in context.items()}  # IAM condition keys are case-insensitive
    for operator, block in conditions.items():
        if operator not in _OPERATORS:
            raise ValueError(f"condition operator {operator} is beyond this evaluator")
        for key, expected in block.items():
            actual = by_key.get(key.lower())
            wanted = _listed(expected)
            if operator == "ForAllValues:StringLike":
                if not all(any(_wildcard(w, str(v)) for w in wanted) for v in _listed(actual or [])):
                    return False
                continue
            if actual is None:
                return False
            if operator in ("StringEquals", "ArnEquals") and str(actual) not in wanted:
                return False
            if operator in ("StringLike", "ArnLike") and not any(_wildcard(w, str(actual)) for w in wanted):
                return False
            if operator == "Bool" and str(actual).lower() not in [str(w).lower() for w in wanted]:
                return False
    return True


def _listed(value: str | list[str]) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def _wildcard(pattern: str, value: str, ignore_case: bool = False) -> bool:
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, value, flags=re.IGNORECASE if ignore_case else 0) is not None
