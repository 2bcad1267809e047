"""schemathesis hooks for tests/test_serve_fuzz.py, loaded by its CLI through SCHEMATHESIS_HOOKS.

One check replaces schemathesis's positive_data_acceptance, stricter: a request the schema allows must get
a 2xx (schemathesis's default also accepts 404, 409, 429 and 5xx), with the one exception no schema can
state: a prompt whose tokens and max_tokens together overflow the model's context, answered with the
n_positions rule's 400 (/openapi.json states the largest max_tokens any prompt leaves, not what a given
prompt leaves). And every answer is tallied (phase, mode, method, path, status) in the file named by
NEURON_SSP_FUZZ_TALLY, so the test can report and bound what was sent and what came back.
"""

from __future__ import annotations

import json
import os
from typing import Any

import schemathesis

CONTEXT_RULE = "cache positions, more than the"  # speculation/positions.py's require_room, as the 400 quotes it
BUDGET_RULE = "must be <= the request's budget"  # serve/app.py's min_tokens rule (vLLM's)
NAMED_TOOL_RULE = "not one of the tools"  # serve/tool_calls.py: a named tool_choice names one of the request's tools


def _mode(case: Any) -> str | None:
    return None if case.meta is None else case.meta.generation.mode.value


@schemathesis.hook
def after_call(context: Any, case: Any, response: Any) -> None:
    phase = None if case.meta is None else case.meta.phase.name.value
    with open(os.environ["NEURON_SSP_FUZZ_TALLY"], "a") as tally:
        tally.write(json.dumps([phase, _mode(case), case.method, case.path, response.status_code]) + "\n")


@schemathesis.check
def schema_valid_requests_get_2xx(ctx: Any, response: Any, case: Any) -> bool | None:
    """Positive cases: a 2xx, or the context rule's 400."""
    if _mode(case) != "positive" or 200 <= response.status_code < 300:
        return None
    if response.status_code == 400 and any(
        rule in response.text for rule in (CONTEXT_RULE, BUDGET_RULE, NAMED_TOOL_RULE)
    ):
        return None
    raise AssertionError(f"a request the schema allows got {response.status_code}: {response.text[:500]}")
