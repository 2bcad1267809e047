"""The request fields that change a request's tokens -> one `RequestControls` (speculation/controls.py).

Structured output arrives under five names: OpenAI's `response_format` (json_object, json_schema), vLLM's
`structured_outputs` (json, regex, choice, grammar, json_object) and its legacy `guided_json`, `guided_regex`,
`guided_choice`, `guided_grammar`. Each becomes a `Grammar` that remembers the field it came from, so the
pipeline's refusals (a schema that does not compile, an engine that samples on the device) name what the client
sent. One constraint per request: two are a 400 naming both. LMI/TGI bodies carry theirs in `parameters`
(`repetition_penalty`, `frequency_penalty`, `grammar` of type json or regex). `strict` does not change anything:
the answer is constrained either way, as vLLM does. A grammar is read in llguidance's Lark dialect (vLLM's
`guidance` backend reads the same). The sampling extras (vLLM's and OpenAI's) map one to one. Values no model could
honour (a token id outside the vocabulary) are the pipeline's to refuse: it knows the vocabulary.
"""

from __future__ import annotations

import json
from typing import Any

from neuron_ssp.errors import Problem
from neuron_ssp.serve.schemas import LmiParameters, Sampling
from neuron_ssp.speculation.controls import Grammar, RequestControls

STRUCTURED_KINDS = ("json", "regex", "choice", "grammar", "json_object")  # vLLM's StructuredOutputsParams
LEGACY = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}


def request_controls(body: Sampling) -> tuple[RequestControls, list[Problem]]:
    """The body's controls, and the problems of the fields that ask for them (all at once)."""
    grammars, problems = _grammars(body)
    if len(grammars) > 1:
        problems.append(one_constraint(grammars))
    controls = RequestControls(
        grammar=grammars[0] if len(grammars) == 1 else None,
        logit_bias=tuple((int(token), float(bias)) for token, bias in (body.logit_bias or {}).items()),
        min_tokens=body.min_tokens,
        ignore_eos=body.ignore_eos,
        stop_token_ids=tuple(body.stop_token_ids or ()),
        repetition_penalty=_or(body.repetition_penalty, 1.0),
        presence_penalty=_or(body.presence_penalty, 0.0),
        frequency_penalty=_or(body.frequency_penalty, 0.0),
        min_p=_or(body.min_p, 0.0),
    )
    return controls, problems


def one_constraint(grammars: list[Grammar]) -> Problem:
    """Two constraints or more in one request (structured output, tools that need one): a 400 naming each field."""
    fields = [g.field for g in grammars]
    return Problem(
        ", ".join(fields),
        [g.kind for g in grammars],
        "one structured-output constraint per request (vLLM's rule too; tools with tool_choice required, a named "
        "function or a strict tool under auto are constrained too)",
        f"send one of {', '.join(fields)}",
    )


def lmi_controls(parameters: LmiParameters) -> tuple[RequestControls, list[Problem]]:
    """TGI's `parameters` that change the tokens: its penalties and its grammar (json or regex)."""
    grammar = parameters.grammar
    found = None if grammar is None else _grammar(grammar.type, grammar.value, "parameters.grammar")
    controls = RequestControls(
        grammar=found if isinstance(found, Grammar) else None,
        repetition_penalty=_or(parameters.repetition_penalty, 1.0),
        frequency_penalty=_or(parameters.frequency_penalty, 0.0),
    )
    return controls, [found] if isinstance(found, Problem) else []


def _or(value: float | None, default: float) -> float:
    return default if value is None else float(value)


def _grammars(body: Sampling) -> tuple[list[Grammar], list[Problem]]:
    """Every structured-output constraint the body asks for, wherever it asks."""
    found: list[Grammar | Problem] = []
    response_format = body.response_format
    if response_format is not None and response_format.type == "json_object":
        found.append(Grammar("json_object", "", "response_format"))
    elif response_format is not None and response_format.type == "json_schema":
        given = response_format.json_schema
        if given is None or given.schema_ is None:
            found.append(
                Problem(
                    "response_format.json_schema.schema",
                    None,
                    "type json_schema needs the JSON Schema the answer follows",
                    'send {"type": "json_schema", "json_schema": {"name": "answer", "schema": {...}}}',
                )
            )
        else:
            found.append(_grammar("json", given.schema_, "response_format"))
    structured = body.structured_outputs
    if structured is not None:
        asked = {
            kind: value
            for kind in STRUCTURED_KINDS
            if (value := getattr(structured, _attribute(kind))) not in (None, False)
        }
        if len(asked) == 1:
            [(kind, value)] = asked.items()
            found.append(_grammar(kind, value, f"structured_outputs.{kind}"))
        else:
            found.append(
                Problem(
                    "structured_outputs",
                    list(asked),
                    f"must ask for exactly one of {', '.join(STRUCTURED_KINDS)} (vLLM's rule)",
                    'send e.g. {"structured_outputs": {"json": {...}}}',
                )
            )
    for name, kind in LEGACY.items():
        value = getattr(body, name)
        if value is not None:
            found.append(_grammar(kind, value, name))
    return [g for g in found if isinstance(g, Grammar)], [p for p in found if isinstance(p, Problem)]


def _attribute(kind: str) -> str:
    return "json_" if kind == "json" else kind  # pydantic's name for the `json` field


def _grammar(kind: str, value: Any, field: str) -> Grammar | Problem:
    if kind == "json":
        schema = value
        if isinstance(value, str):
            try:
                schema = json.loads(value)
            except json.JSONDecodeError as exc:
                return Problem(field, value[:80], f"not valid JSON ({exc.msg} at character {exc.pos})", _SCHEMA_FIX)
        if not isinstance(schema, dict):
            return Problem(field, value, "must be a JSON Schema: an object, or its text", _SCHEMA_FIX)
        return Grammar("json_schema", json.dumps(schema), field)
    if kind == "choice":
        return Grammar("choice", json.dumps(list(value)), field)
    if kind == "json_object":
        return Grammar("json_object", "", field)
    return Grammar("regex" if kind == "regex" else "lark", value, field)


_SCHEMA_FIX = 'send a JSON Schema such as {"type": "object", "properties": {"name": {"type": "string"}}}'
