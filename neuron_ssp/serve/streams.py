"""Answers built from a job's events: one JSON body, SSE chunks (OpenAI) or JSON lines (LMI).

While it waits, a route checks its client every DISCONNECT_POLL_S and enforces request_timeout; a
client that left, or a route that gives up, cancels the job (the worker stops at the next iteration).
A client that left is not a server error: the job is marked so, and the worker counts it as aborted.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from neuron_ssp.serve import sagemaker
from neuron_ssp.serve.responses import OpenAIFormat
from neuron_ssp.serve.schemas import GenerationRequest
from neuron_ssp.serve.text import TextPiece
from neuron_ssp.serve.worker import Delta, Done, Event, Failed, Job, timeout_error

log = logging.getLogger("neuron_ssp.serve")
DISCONNECT_POLL_S = 0.25


class ClientGone(Exception):
    """The client closed the connection before its answer was ready."""


async def next_event(job: Job, request: Request) -> Event:
    """The job's next event; checks for a disconnect every DISCONNECT_POLL_S and enforces request_timeout."""
    while True:
        now = time.monotonic()
        if now - job.client_seen >= DISCONNECT_POLL_S:
            if await request.is_disconnected():
                job.leave()
                log.info("request %s: client disconnected, cancelled", job.request_id)
                raise ClientGone
            job.client_seen = now
        remaining = job.deadline - now
        if remaining <= 0:
            job.cancelled.set()
            return Failed(timeout_error(job))
        try:
            return await asyncio.wait_for(job.events.get(), min(DISCONNECT_POLL_S, remaining))
        except asyncio.TimeoutError:
            continue


async def collect(job: Job, request: Request, event: Event) -> Done:
    try:
        while not isinstance(event, Done):
            if isinstance(event, Failed):
                raise event.error
            event = await next_event(job, request)
        return event
    finally:
        job.cancelled.set()  # no-op once done; stops the worker if this route gives up


async def sse_stream(job: Job, request: Request, fmt: OpenAIFormat, event: Event) -> AsyncIterator[str]:
    """SSE chunks until `data: [DONE]`; a disconnect cancels the task here, and `finally` cancels the job."""
    ended = False
    try:
        first = fmt.first_chunk()
        if first:
            yield first
        while True:
            if isinstance(event, Delta) and (event.pieces or event.logprobs):
                for chunk in fmt.delta_chunks(event):
                    yield chunk
            elif isinstance(event, Done):
                for chunk in fmt.last_chunks(event):
                    yield chunk
                ended = True
                return
            elif isinstance(event, Failed):
                for chunk in fmt.failed_chunks(event.error):
                    yield chunk
                ended = True
                return
            event = await next_event(job, request)
    except ClientGone:
        return
    finally:
        _release(job, request, ended)


def _release(job: Job, request: Request, ended: bool) -> None:
    """A stream that stops before its last event stops because its client left (the task was cancelled): the job
    is cancelled as aborted, and the request is marked so for the status counter (serve/gate.py: 499)."""
    if not ended:
        job.leave()
        request.state.client_gone = True
    job.cancelled.set()  # a no-op once the job is done


async def lmi_answer(job: Job, request: Request, spec: GenerationRequest, first: Event) -> Response:
    if not spec.stream:
        done = await collect(job, request, first)
        return JSONResponse(sagemaker.lmi_body(done, spec.prompt, spec.details))

    async def lines(event: Event) -> AsyncIterator[str]:
        held: TextPiece | None = None  # LMI's last line carries the last token, so one piece waits
        ended = False
        try:
            while True:
                if isinstance(event, Delta):
                    for piece in event.pieces:
                        if held is not None:
                            yield sagemaker.lmi_token_lines([held])[0]
                        held = piece
                elif isinstance(event, Done):
                    yield sagemaker.lmi_last_line(event, spec.prompt, held)
                    ended = True
                    return
                else:
                    yield sagemaker.lmi_error_line(event.error)
                    ended = True
                    return
                event = await next_event(job, request)
        except ClientGone:
            return
        finally:
            _release(job, request, ended)

    return StreamingResponse(lines(first), media_type=sagemaker.JSONLINES)
