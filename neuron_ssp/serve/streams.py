"""Answers built from a request's events: one JSON body, SSE chunks (OpenAI) or JSON lines (LMI).

A request is a group of jobs, one per choice (`n`), whose events arrive on one queue marked with their choice.
While it waits, a route checks its client every DISCONNECT_POLL_S and enforces request_timeout; a
client that left, or a route that gives up, cancels the jobs (the worker stops at the next iteration).
A client that left is not a server error: the jobs are marked so, and the worker counts them as aborted. One
choice that fails fails the request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from neuron_ssp.serve import sagemaker
from neuron_ssp.serve.requests import GenerationRequest
from neuron_ssp.serve.responses import OpenAIFormat
from neuron_ssp.serve.text import TextPiece
from neuron_ssp.serve.worker import Delta, Done, Event, Failed, JobGroup, timeout_error

log = logging.getLogger("neuron_ssp.serve")
DISCONNECT_POLL_S = 0.25
# a client that leaves keeps its places until its route notices (within DISCONNECT_POLL_S, later on a loaded
# loop): a request that finds the server full waits this long for them before its 503
FULL_WAIT_S = 4 * DISCONNECT_POLL_S


class ClientGone(Exception):
    """The client closed the connection before its answer was ready."""


async def submit(group: JobGroup) -> None:
    """Queue the request's jobs; where the server is full, first wait up to FULL_WAIT_S for the places of clients
    that have left (a client that sends its requests one after another is not refused for the one it just left),
    then refuse with the worker's 503."""
    deadline = time.monotonic() + FULL_WAIT_S
    while not group.worker.has_room(len(group.jobs)) and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    group.worker.submit(group.jobs)


async def next_event(group: JobGroup, request: Request) -> Event:
    """The request's next event; checks for a disconnect every DISCONNECT_POLL_S and enforces request_timeout."""
    while True:
        now = time.monotonic()
        if now - group.client_seen >= DISCONNECT_POLL_S:
            if await request.is_disconnected():
                group.leave()
                log.info("request %s: client disconnected, cancelled", group.request_id)
                raise ClientGone
            group.client_seen = now
        remaining = group.deadline - now
        if remaining <= 0:
            group.cancel()
            return Failed(timeout_error(group))
        try:
            return await asyncio.wait_for(group.events.get(), min(DISCONNECT_POLL_S, remaining))
        except asyncio.TimeoutError:
            continue


async def collect(group: JobGroup, request: Request, event: Event) -> list[Done]:
    """Every choice's last event, in choice order; the first failure raises."""
    done: dict[int, Done] = {}
    try:
        while True:
            if isinstance(event, Failed):
                raise event.error
            if isinstance(event, Done):
                done[event.choice] = event
                if len(done) == len(group.jobs):
                    return [done[i] for i in range(len(done))]
            event = await next_event(group, request)
    finally:
        group.cancel()  # no-op once done; stops the worker if this route gives up


async def sse_stream(group: JobGroup, request: Request, fmt: OpenAIFormat, event: Event) -> AsyncIterator[str]:
    """SSE chunks until `data: [DONE]`, each choice's under its index; a disconnect cancels the task here, and
    `finally` cancels the jobs."""
    ended = False
    finished: list[Done] = []
    try:
        for first in fmt.first_chunks(len(group.jobs)):
            yield first
        while True:
            if isinstance(event, Delta) and (event.pieces or event.logprobs):
                for chunk in fmt.delta_chunks(event):
                    yield chunk
            elif isinstance(event, Done):
                finished.append(event)
                for chunk in fmt.choice_end_chunks(event):
                    yield chunk
                if len(finished) == len(group.jobs):
                    for chunk in fmt.last_chunks(finished):
                        yield chunk
                    ended = True
                    return
            elif isinstance(event, Failed):
                for chunk in fmt.failed_chunks(event.error):
                    yield chunk
                ended = True
                return
            event = await next_event(group, request)
    except ClientGone:
        return
    finally:
        _release(group, request, ended)


def _release(group: JobGroup, request: Request, ended: bool) -> None:
    """A stream that stops before its last event stops because its client left (the task was cancelled): the jobs
    are cancelled as aborted, and the request is marked so for the status counter (serve/gate.py: 499)."""
    if not ended:
        group.leave()
        request.state.client_gone = True
    group.cancel()  # a no-op once the jobs are done


async def lmi_answer(group: JobGroup, request: Request, spec: GenerationRequest, first: Event) -> Response:
    """LMI's answer (one choice: its bodies have no n)."""
    if not spec.stream:
        [done] = await collect(group, request, first)
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
                event = await next_event(group, request)
        except ClientGone:
            return
        finally:
            _release(group, request, ended)

    return StreamingResponse(lines(first), media_type=sagemaker.JSONLINES)
