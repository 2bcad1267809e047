"""ASGI middleware: request ids, the 1 MiB body limit, the API key, the per-status request counter, and
the 500 for a failure no route expected.

A client that leaves is counted with status 499, not a server error: a non-streamed answer is 499 itself, and a
stream whose 200 had started is marked by the route (`client_gone` in the request's state) and counted as 499.

Pure ASGI (not BaseHTTPMiddleware) so that a streaming response still sees its client disconnect. The
key guards /v1/* and /invocations; under --sagemaker, SageMaker authenticates /invocations callers
itself (and sends no key), so there it guards /v1/* only. Its refusals are rendered like every other
error (serve/errors.py).

Every request gets its own id (the response `id` is built from it, so two answers never share one); a
client's `X-Request-Id` is echoed in that header and logged beside ours, never used as the id itself.
An unexpected exception is answered here with a 500 and not re-raised: Starlette's outermost middleware
re-raises after its own 500, and uvicorn then drops the keep-alive connection without `Connection: close`,
so the client's next request on it failed.
"""

from __future__ import annotations

import hmac
import logging
import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from fastapi.responses import JSONResponse

from neuron_ssp.errors import Problem
from neuron_ssp.serve.errors import ApiError, error_body, error_response
from neuron_ssp.serve.metrics import ServerMetrics

log = logging.getLogger("neuron_ssp.serve")

MAX_BODY_BYTES = 1 << 20
CLIENT_CLOSED = 499  # nginx's "client closed request": what the request counter records for a disconnect
GENERATION_PATHS = ("/v1/chat/completions", "/v1/completions", "/invocations")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class Gate:
    def __init__(self, app: ASGIApp, metrics: ServerMetrics, api_key: str | None, sagemaker: bool = False):
        self.app = app
        self.metrics = metrics
        self.api_key = api_key.encode() if api_key else None
        self.guarded = ("/v1/",) if sagemaker else ("/v1/", "/invocations")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        request_id, client_id = uuid.uuid4().hex, headers.get("x-request-id")
        scope.setdefault("state", {}).update(request_id=request_id, client_request_id=client_id)
        echoed = (client_id or request_id).encode("latin-1")
        status = [0]  # 0 until the response starts

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                message["headers"] = [
                    (name, value) for name, value in message.get("headers", []) if name.lower() != b"x-request-id"
                ] + [(b"x-request-id", echoed)]
            await send(message)

        try:
            refusal = self._refusal(scope["path"], headers)
            if refusal is not None:
                await error_response(refusal)(scope, receive, send_with_id)
            else:
                await self.app(scope, receive, send_with_id)
        except Exception as exc:
            log.error("request %s (client's X-Request-Id %s) failed", request_id, client_id, exc_info=exc)
            if status[0]:  # a response half sent cannot be completed: the connection has to close
                raise
            body = error_body(500, f"internal server error (request id {request_id}); the server log holds the details")
            await JSONResponse(body, status_code=500)(scope, receive, send_with_id)
        finally:
            if scope["path"] in GENERATION_PATHS:
                gone = scope["state"].get("client_gone")  # a stream whose client left after its 200 started
                self.metrics.requests.labels(scope["path"], str(CLIENT_CLOSED if gone else status[0] or 500)).inc()

    def _refusal(self, path: str, headers: dict[str, str]) -> ApiError | None:
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > MAX_BODY_BYTES:
            return body_too_large(int(length))
        if self.api_key is not None and path.startswith(self.guarded):
            scheme, _, given = headers.get("authorization", "").partition(" ")
            # compare_digest: the time taken does not tell how much of the key was right
            if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), self.api_key):
                return ApiError(
                    401,
                    Problem(
                        "Authorization",
                        "(missing)" if not given else "(hidden)",
                        "a missing or wrong API key",
                        "send the header "
                        "'Authorization: Bearer <key>' with the key the server was "
                        "started with (its --api-key-env variable)",
                    ),
                )
        return None


def body_too_large(size: int | str) -> ApiError:
    return ApiError(
        413,
        Problem(
            "body",
            f"{size} bytes",
            f"a request body may hold at most {MAX_BODY_BYTES} bytes (1 MiB)",
            "shorten the prompt or the conversation",
        ),
    )
