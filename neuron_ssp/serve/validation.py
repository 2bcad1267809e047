"""Bytes -> a validated body model, or a 400 whose problems name field, value, rule and fix.

The JSON parser has two limits of its own that a body can reach: integers of more than
`sys.get_int_max_str_digits()` digits (a ValueError) and nesting deep enough to exhaust the interpreter's
recursion limit (a RecursionError). Both were 500s. A body is refused past MAX_JSON_DEPTH levels, whichever
of the two checks sees it first, so the rule a client reads does not depend on the server's stack.

Value rules live on the pydantic models as constraints (ge, le, min_length, pattern ...), so the same
declaration checks a body and states the limit in /openapi.json; pydantic reports every failing field at
once, and each error becomes a Problem here: the rule and the fix from the error's own bound, and the
field's description (what the limit is for).
"""

from __future__ import annotations

import json
import sys
import typing
from typing import Any

from pydantic import BaseModel, ValidationError

from neuron_ssp.errors import Problem
from neuron_ssp.serve.errors import ApiError

MAX_JSON_DEPTH = 32  # nesting levels of a body; an OpenAI body needs 5 (body, messages, message, content, part)

# pydantic's error type -> (rule, fix), formatted with the error's context (the bound the field declares)
BOUND_RULES = {
    "greater_than_equal": ("must be >= {ge}", "send a value >= {ge}"),
    "greater_than": ("must be > {gt}", "send a value above {gt}"),
    "less_than_equal": ("must be <= {le}", "send a value <= {le}"),
    "less_than": ("must be < {lt}", "send a value below {lt}"),
    "too_short": ("must hold at least {min_length} item(s)", "send at least {min_length}"),
    "too_long": ("must hold at most {max_length} item(s)", "send at most {max_length}"),
    "string_too_short": ("must hold at least {min_length} character(s)", "send a non-empty string"),
    "string_pattern_mismatch": ("must hold a character that is not white space", "send some text"),  # NOT_BLANK
    "int_type": ("must be an integer", 'send a JSON integer such as 3 (not "3", 3.5 or true)'),
    "float_type": ("must be a number", 'send a JSON number such as 0.7 (not "0.7" or true)'),
    "bool_type": ("must be true or false", 'send a JSON boolean (not "true" or 1)'),
    "string_type": ("must be a string", 'send a JSON string such as "Hi"'),
    # a constrained string is checked as UTF-8 before schemas._unicode sees it: the same rule
    "string_unicode": ("holds a lone surrogate: not valid Unicode text", "send valid Unicode text"),
}


def parse_json(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object, or a 400 that says where it stopped parsing or which limit it passed."""
    snippet = raw[:80].decode("utf-8", "replace")
    try:
        data = json.loads(raw)
    except RecursionError:
        raise _too_deep(snippet) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        where = f" at line {exc.lineno}, column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else ""
        raise ApiError(
            400,
            Problem(
                "body", snippet, f"not valid JSON{where}", "send a JSON object with Content-Type: application/json"
            ),
        ) from None
    except ValueError:  # what remains: an integer too long for int()
        digits = sys.get_int_max_str_digits()
        raise ApiError(
            400,
            Problem(
                "body",
                snippet,
                f"holds an integer of more than {digits} digits, more than the server's JSON parser converts",
                "send integers within 64 bits",
            ),
        ) from None
    if _depth(data) > MAX_JSON_DEPTH:
        raise _too_deep(snippet)
    if not isinstance(data, dict):
        raise ApiError(
            400,
            Problem(
                "body",
                data,
                "must be a JSON object",
                'send an object such as {"model": ..., "messages": [{"role": "user", "content": "Hi"}]}',
            ),
        )
    return data


def validate(model: type[BaseModel], data: dict[str, Any]) -> Any:
    """`model.model_validate(data)`, or a 400 with one Problem per failing field."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ApiError(400, [_problem(model, err) for err in _informative(exc.errors())]) from None


def _too_deep(snippet: str) -> ApiError:
    return ApiError(
        400,
        Problem(
            "body",
            snippet,
            f"nested more than {MAX_JSON_DEPTH} levels deep",
            f"send a body nested at most {MAX_JSON_DEPTH} levels (objects and arrays)",
        ),
    )


def _depth(data: Any) -> int:
    """Nesting levels of parsed JSON, without recursion; stops counting past MAX_JSON_DEPTH."""
    deepest, stack = 0, [(data, 1)]
    while stack and deepest <= MAX_JSON_DEPTH:
        value, level = stack.pop()
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else None
        if children is not None:
            deepest = max(deepest, level)
            stack.extend((child, level + 1) for child in children if isinstance(child, (dict, list)))
    return deepest


def _problem(model: type[BaseModel], err: Any) -> Problem:
    where = _field(err["loc"])
    if err["type"] == "missing":
        return Problem(where, None, "required field is missing", f"add `{where}` to the body")
    rule, fix = BOUND_RULES.get(err["type"], (err["msg"].lower(), f"send {where} with the right type"))
    context = {k: f"{v:g}" if isinstance(v, float) else v for k, v in (err.get("ctx") or {}).items()}
    rule, fix = rule.format(**context), fix.format(**context)
    described = _description(model, err["loc"])
    return Problem(where, err.get("input"), f"{rule} ({described})" if described else rule, fix)


def _field(loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in loc if not _union_tag(p))


def _union_tag(part: Any) -> bool:
    """pydantic names the branch of a union in `loc` (`str`, `list[str]`, `constrained-str`): not a field."""
    return isinstance(part, str) and (not part.isidentifier() or part in {"str", "int", "float", "bool"})


def _informative(errors: list[Any]) -> list[Any]:
    """One error per field. A value that fails every branch of a union (a string or a list of them) fails
    the other branches on its type: the error that says what is wrong with it is the one to report."""
    chosen: dict[str, Any] = {}
    for err in errors:
        field = ".".join(str(p) for p in err["loc"][: _first_tag(err["loc"])])
        held = chosen.get(field)
        if held is None or (held["type"].endswith("_type") and not err["type"].endswith("_type")):
            chosen[field] = err
    return list(chosen.values())


def _first_tag(loc: tuple[Any, ...]) -> int:
    return next((i for i, part in enumerate(loc) if _union_tag(part)), len(loc))


def _description(model: type[BaseModel], loc: tuple[Any, ...]) -> str | None:
    """The description of the field at `loc`, following nested models (list items, union branches)."""
    info = None
    for part in loc:
        if not isinstance(part, str) or _union_tag(part):
            continue
        fields = model.model_fields if isinstance(model, type) and issubclass(model, BaseModel) else {}
        if part not in fields:
            return None
        info = fields[part]
        model = _inner_model(info.annotation)
    return info.description if info is not None else None


def _inner_model(annotation: Any) -> Any:
    """The pydantic model inside `list[M]`, `M | None` or `Annotated[...]`, if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _inner_model(arg)
        if found is not None:
            return found
    return None
