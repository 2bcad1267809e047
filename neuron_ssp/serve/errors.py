"""OpenAI error bodies: `{"error": {"message", "type", "param", "code"}}`, as vLLM's server sends them.

The message names the field, the value, the rule and the fix (the CLI's `Problem` text). `code` is the
HTTP status (vLLM's ErrorInfo). Nothing else about a failure, a traceback least of all, reaches a client.
"""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse

from neuron_ssp.errors import Problem

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    500: "internal_server_error",
    503: "service_unavailable",
    504: "timeout_error",
}


class ApiError(Exception):
    """A request the server answers with an error status; raised anywhere a route runs."""

    def __init__(self, status: int, problems: list[Problem] | Problem, headers: dict[str, str] | None = None):
        self.status = status
        self.problems = [problems] if isinstance(problems, Problem) else list(problems)
        self.headers = headers or {}
        super().__init__(self.message)

    @property
    def message(self) -> str:
        return "\n".join(str(p) for p in self.problems)  # one line per problem, as the CLI's paragraphs

    @property
    def param(self) -> str | None:
        return self.problems[0].field if self.problems else None

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, self.param)


def error_body(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    return {
        "error": {
            "message": _utf8(message),
            "type": ERROR_TYPES.get(status, "invalid_request_error"),
            "param": param if param is None else _utf8(param),
            "code": status,
        }
    }


def _utf8(text: str) -> str:
    """A value quoted back may hold a lone surrogate (JSON allows "\\ud800"): escape it so the body encodes."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def error_response(error: ApiError) -> JSONResponse:
    """The error's body and headers; the gate (serve/gate.py) adds X-Request-Id to every response."""
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)
