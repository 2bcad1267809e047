"""SageMaker's container contract: `GET /ping`, `POST /invocations`, and LMI/TGI bodies.

/invocations takes the OpenAI chat and completions bodies (routed by their `messages` / `prompt`) and
SageMaker LMI's `{"inputs": ..., "parameters": {...}, "stream": bool}` (DJL Serving's documented
rolling-batch schema). LMI answers `{"generated_text", "details"?}`; streamed, it sends JSON lines
`{"token": {"id", "text", "log_prob"}}` whose last line adds `generated_text` and `details`, which
`invoke_endpoint_with_response_stream` delivers as payload parts.
"""

from __future__ import annotations

import json
from typing import Any

from neuron_ssp.serve.errors import ApiError
from neuron_ssp.serve.responses import speculative_stats
from neuron_ssp.serve.text import TextPiece
from neuron_ssp.serve.worker import Done

JSONLINES = "application/jsonlines"


def lmi_body(done: Done, inputs: str, details: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"generated_text": done.text}
    if details:
        body["details"] = _details(done, inputs)
    body["speculative"] = speculative_stats(done.stats, done.seed)
    return body


def lmi_token_lines(pieces: list[TextPiece]) -> list[str]:
    return [_line({"token": _token(p)}) for p in pieces]


def lmi_last_line(done: Done, inputs: str, last: TextPiece | None) -> str:
    token = _token(last) if last else {"id": -1, "text": "", "log_prob": None, "special_token": True}
    return _line(
        {
            "token": token,
            "generated_text": done.text,
            "details": _details(done, inputs),
            "speculative": speculative_stats(done.stats, done.seed),
        }
    )


def _token(piece: TextPiece) -> dict[str, Any]:
    return {"id": piece.token, "text": piece.text, "log_prob": None, "origin": piece.origin}


def _details(done: Done, inputs: str) -> dict[str, Any]:
    return {"finish_reason": done.finish_reason, "generated_tokens": done.completion_tokens, "inputs": inputs}


def _line(data: dict[str, Any]) -> str:
    return json.dumps(data, ensure_ascii=False) + "\n"


def lmi_error_line(error: ApiError) -> str:
    """A failure after the first line: LMI's streamed error shape, with our message added."""
    return _line(
        {
            "token": {"id": -1, "text": "", "log_prob": None, "special_token": True},
            "generated_text": "",
            "details": {"finish_reason": "error", "generated_tokens": None, "inputs": None},
            "error": error.body()["error"],
        }
    )
