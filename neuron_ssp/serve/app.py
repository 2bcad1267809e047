"""The FastAPI app: OpenAI routes, SageMaker routes, /metrics, /health and the playground page.

Each generation route takes JSON only (415 otherwise: a form or text/plain body is what a web page can
POST cross-site without a preflight), turns its body into a `GenerationRequest`, encodes the prompt,
checks that it fits the cache and that the engine can honour its sampling, queues a `Job` for the worker
and answers from the job's events (serve/streams.py). /openapi.json describes every route from the
same pydantic models (serve/openapi.py).

Prompts are encoded off the event loop, one at a time on the app's own thread (a MB of text takes the tokenizer about
0.5 s, during which the loop must go on answering /health and streaming), and a text that cannot fit the context
is refused before it is tokenized (pipeline/prompt_length.py).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import replace
from importlib import resources
from typing import Any

import torch
from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from neuron_ssp.config import Config, SamplingConfig, ServeConfig
from neuron_ssp.drafters.registry import drafter_kind
from neuron_ssp.errors import NeuronSSPError, Problem
from neuron_ssp.pipeline.pipeline import logprobs_problem
from neuron_ssp.pipeline.prompts import ChatTurn
from neuron_ssp.serve import openapi
from neuron_ssp.serve.errors import ApiError, error_response
from neuron_ssp.serve.gate import CLIENT_CLOSED, MAX_BODY_BYTES, Gate, body_too_large
from neuron_ssp.serve.metrics import ServerMetrics
from neuron_ssp.serve.requests import GenerationRequest, chat_request, completion_request, invocation_request
from neuron_ssp.serve.responses import OpenAIFormat
from neuron_ssp.serve.served_pipeline import ServedPipeline
from neuron_ssp.serve.streams import ClientGone, collect, lmi_answer, next_event, sse_stream, submit
from neuron_ssp.serve.tokens import detokenize, tokenize, within_vocabulary
from neuron_ssp.serve.tool_calls import conversation
from neuron_ssp.serve.validation import parse_json
from neuron_ssp.serve.worker import Event, Failed, GenerationWorker, Job, JobGroup
from neuron_ssp.topology.positions import max_new_tokens_within

log = logging.getLogger("neuron_ssp.serve")
WORKER_JOIN_S = 60.0  # at shutdown, how long to wait for a prefill that cannot be interrupted


def create_app(pipeline: ServedPipeline, settings: ServeConfig, model_name: str, api_key: str | None) -> FastAPI:
    metrics = ServerMetrics(model_name, pipeline.target.n_positions, draft_positions(pipeline.config))
    worker = GenerationWorker(pipeline, metrics, settings.max_queue)
    encoder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prompt-encoder")
    limit = pipeline.prompt_limit  # read here, once: it walks the vocabulary
    log.info("tools rendered by %s", "the chat template" if pipeline.template_renders_tools else "the server")
    if limit.reach is None:
        log.info("this tokenizer may shorten a text: every prompt is tokenized before its length is checked")

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        worker.start()
        yield
        encoder.shutdown(wait=False, cancel_futures=True)
        # uvicorn has waited for the open requests (SIGTERM: up to drain_timeout, then the worker cut the running
        # one and its client got a final error); the thread must end before the interpreter does
        if not await asyncio.to_thread(worker.stop, WORKER_JOIN_S):
            log.error("the generation worker is still busy after %.0f s (an uninterruptible prefill)", WORKER_JOIN_S)

    app = FastAPI(
        title="neuron-ssp", version=openapi.VERSION, lifespan=lifespan, redoc_url=None, description=openapi.DESCRIPTION
    )
    app.state.worker = worker
    app.state.metrics = metrics

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        """404 and 405 (whose `Allow` header, RFC 9110's, Starlette's router puts in the exception's headers)."""
        fix = (
            "see docs/serving.md for the routes"
            if exc.status_code == 404
            else f"send {(exc.headers or {}).get('Allow', 'another method')} to {request.url.path}"
        )
        return error_response(
            ApiError(
                exc.status_code,
                Problem("path", request.url.path, str(exc.detail).lower(), fix),
                headers=dict(exc.headers or {}),
            )
        )

    async def generate(request: Request, spec: GenerationRequest) -> Response:
        request_id = request.state.request_id
        _check_model(spec.model, model_name)
        max_tokens = spec.max_tokens or pipeline.config.generation.max_new_tokens
        _refuse_asked(pipeline, spec, max_tokens, worker.capacity)
        prompt_ids = await asyncio.get_running_loop().run_in_executor(encoder, _encode, pipeline, spec)
        _check_room(pipeline, prompt_ids, max_tokens, spec)
        sampling = _sampling(pipeline, spec)
        timeout = settings.timeout_s
        deadline, loop, events = time.monotonic() + timeout, asyncio.get_running_loop(), asyncio.Queue[Event]()
        group = JobGroup(
            [
                Job(
                    request_id,
                    prompt_ids,
                    max_tokens,
                    choice_sampling(sampling, choice),
                    spec.stop,
                    deadline,
                    timeout,
                    loop,
                    spec.top_logprobs if spec.logprobs else None,
                    spec.controls,
                    spec.include_stop_str,
                    choice,
                    events,
                )
                for choice in range(spec.n)
            ],
            worker,
        )
        await submit(group)
        log.info(
            "request %s queued: %s, n %d, %d prompt tokens, max_tokens %d, stream %s, client's X-Request-Id %s",
            request_id,
            spec.kind,
            spec.n,
            len(prompt_ids),
            max_tokens,
            spec.stream,
            request.state.client_request_id,
        )
        try:
            first = await next_event(group, request)
            if isinstance(first, Failed):
                group.cancel()  # the other choices' places go back now, not when the worker reaches them
                raise first.error
            if spec.kind == "lmi":
                return await lmi_answer(group, request, spec, first)
            fmt = OpenAIFormat(
                spec.kind, request_id, model_name, len(prompt_ids), spec.include_usage, spec.logprobs, spec.tools
            )
            if spec.stream:
                return StreamingResponse(sse_stream(group, request, fmt, first), media_type="text/event-stream")
            return JSONResponse(fmt.final(await collect(group, request, first)))
        except ClientGone:  # not a server error: counted as aborted by the worker, logged at info
            return Response(status_code=CLIENT_CLOSED)

    @app.post("/v1/chat/completions", **openapi.route("chat"))
    async def chat_completions(request: Request) -> Response:
        return await generate(request, chat_request(await _read_json(request)))

    @app.post("/v1/completions", **openapi.route("completion"))
    async def completions(request: Request) -> Response:
        return await generate(request, completion_request(await _read_json(request)))

    @app.post("/invocations", **openapi.route("invocations"))
    async def invocations(request: Request) -> Response:
        return await generate(request, invocation_request(await _read_json(request)))

    def card() -> dict[str, Any]:
        return {
            "id": model_name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "neuron-ssp",
            "max_model_len": pipeline.target.n_positions,
        }

    @app.get("/v1/models", **openapi.route("models"))
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [card()]}

    @app.get("/v1/models/{model_id:path}", **openapi.route("model"))
    async def model(model_id: str) -> dict[str, Any]:
        if model_id != model_name:
            raise ApiError(404, _unknown_model(model_id, model_name, "model_id"))
        return card()

    @app.post("/tokenize", **openapi.route("tokenize"))
    async def tokenize_route(request: Request) -> dict[str, Any]:
        data = await _read_json(request)
        _check_model(data.get("model") if isinstance(data.get("model"), str) else None, model_name)  # else a 400
        return await asyncio.get_running_loop().run_in_executor(encoder, tokenize, pipeline, data)

    @app.post("/detokenize", **openapi.route("detokenize"))
    async def detokenize_route(request: Request) -> dict[str, Any]:
        data = await _read_json(request)
        _check_model(data.get("model") if isinstance(data.get("model"), str) else None, model_name)  # else a 400
        return await asyncio.get_running_loop().run_in_executor(encoder, detokenize, pipeline, data)

    @app.get("/health", **openapi.route("health"))
    async def health() -> Response:
        if not worker.accepting or not worker.thread.is_alive():
            return JSONResponse({"status": "draining"}, status_code=503)
        return JSONResponse({"status": "ok", "queue_depth": worker.queue.qsize(), "running": worker.running})

    @app.get("/ping", **openapi.route("health"))
    async def ping() -> Response:
        """SageMaker: 200 once the models are loaded (the app exists only after loading) and while serving."""
        return await health()

    @app.get("/metrics", **openapi.route("metrics"))
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/", response_class=HTMLResponse, **openapi.route("page"))
    async def playground() -> HTMLResponse:
        page = resources.files("neuron_ssp.serve").joinpath("static/playground.html").read_text()
        return HTMLResponse(page.replace("{{MODEL}}", model_name))

    largest = max_new_tokens_within(pipeline.target.n_positions, 1, pipeline.extra_slots)  # for a 1-token prompt
    refused = openapi.refused_controls(pipeline)
    vocab = pipeline.target.vocab_size
    app.openapi = lambda: openapi.document(  # type: ignore[method-assign]
        app, model_name, largest, vocab, refused, worker.capacity
    )
    app.add_middleware(Gate, metrics=metrics, api_key=api_key, sagemaker=settings.sagemaker)
    # outermost: a browser's preflight (OPTIONS, no key) is answered before the gate, and every answer carries the
    # headers; vLLM's defaults (--allowed-origins '["*"]', no credentials, any method and header)
    app.add_middleware(CORSMiddleware, allow_origins=settings.allowed_origins, allow_methods=["*"], allow_headers=["*"])
    return app


def choice_sampling(sampling: SamplingConfig, choice: int) -> SamplingConfig:
    """Choice `choice`'s sampling: the request's for the first, and for the others a seed derived from the
    request's: the first 63 bits of SHA-256 of "<seed>:<choice>" (send that seed alone to reproduce the choice).
    Greedy choices draw nothing (they are all the same answer), and an engine that samples on the device keeps its
    own seed."""
    if choice == 0 or sampling.seed is None or sampling.temperature == 0:
        return sampling
    digest = hashlib.sha256(f"{sampling.seed}:{choice}".encode()).digest()
    return sampling.model_copy(update={"seed": int.from_bytes(digest[:8], "big") >> 1})


def _check_model(asked: Any, model_name: str) -> None:
    """A 404 for a model this server does not serve (None, or no `model`, means the one it serves)."""
    if asked is not None and asked != model_name:
        raise ApiError(404, _unknown_model(asked, model_name, "model"))


def _unknown_model(asked: Any, model_name: str, field: str) -> Problem:
    return Problem(field, asked, "no such model on this server", f"send model '{model_name}' (GET /v1/models lists it)")


def draft_positions(config: Config) -> int:
    """Draft tokens a target call scores at most (vLLM's num_speculative_tokens): k - 1, or 0 without a drafter."""
    return config.speculation.k - 1 if drafter_kind(config.speculation.drafter).drafts else 0


async def _read_json(request: Request) -> dict[str, Any]:
    """The body, read with a cap (a chunked upload has no Content-Length for the gate to check)."""
    media_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media_type != "application/json" and not media_type.endswith("+json"):
        raise ApiError(
            415,
            Problem(
                "Content-Type",
                media_type or "(none)",
                "a generation request must be JSON (a "
                "form or text/plain body is what a web page can send cross-site without asking)",
                "send the header 'Content-Type: application/json'",
            ),
        )
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise body_too_large(f"more than {MAX_BODY_BYTES}")
        chunks.append(chunk)
    return parse_json(b"".join(chunks))


def _encode(pipeline: ServedPipeline, spec: GenerationRequest) -> torch.Tensor:
    """The prompt's ids (run on the encoder thread), or a 400 naming the field the client sent."""
    if spec.prompt_ids is not None:
        return within_vocabulary(pipeline, spec.prompt_ids, spec.prompt_ids_field)
    try:
        if spec.kind == "chat":
            messages, template_tools = conversation(spec.turns, spec.tools, pipeline.template_renders_tools)
            turn = ChatTurn(spec.add_generation_prompt, spec.continue_final_message)
            return pipeline.encode_messages(messages, pipeline.prompt_limit, turn, template_tools)
        # completions and LMI: raw text, no template
        return pipeline.encode(spec.prompt, chat_template=False, limit=pipeline.prompt_limit)
    except NeuronSSPError as exc:
        field = {"prompt": "inputs"} if spec.kind == "lmi" else {}  # name the field the client sent
        raise ApiError(400, [replace(p, field=field.get(p.field, p.field)) for p in exc.problems]) from None


def _sampling(pipeline: ServedPipeline, spec: GenerationRequest) -> SamplingConfig:
    """The request's sampling over the server's, or a 400 for what this engine cannot do per request."""
    try:
        sampling = pipeline.request_sampling(spec.temperature, spec.top_p, spec.top_k, spec.seed)
    except NeuronSSPError as exc:
        raise ApiError(
            400, [replace(p, field=f"parameters.{p.field}") if spec.kind == "lmi" else p for p in exc.problems]
        ) from None
    if spec.logprobs and not pipeline.scores_tokens:
        raise ApiError(400, logprobs_problem(pipeline.config.speculation.engine))
    return sampling


def _refuse_asked(pipeline: ServedPipeline, spec: GenerationRequest, max_tokens: int, capacity: int) -> None:
    """Everything the request asks that this server refuses, in one 400 before its prompt is encoded: the fields
    the body's parsing refused, the pipeline's refusals of its controls (values no model honours, what this engine
    cannot run) and vLLM's rule between min_tokens and the budget."""
    refused = pipeline.controls_problems(spec.controls)
    if spec.kind == "lmi":  # name the field the client sent: TGI's are in `parameters`
        refused = [
            p if p.field.startswith("parameters.") else replace(p, field=f"parameters.{p.field}") for p in refused
        ]
    problems = spec.problems + refused
    if spec.n > capacity:
        problems.append(
            Problem(
                "n",
                spec.n,
                f"must be <= {capacity}: each choice is a row of the batch, and this server holds {capacity} "
                "(serve.max_batch rows running plus serve.max_queue waiting)",
                f"send n <= {capacity}, or split the request",
            )
        )
    if spec.controls.min_tokens > max_tokens:
        budget = (
            f"{spec.budget_field} = {max_tokens}"
            if spec.max_tokens is not None
            else f"the server's default budget, {max_tokens}, as {spec.budget_field} was not sent"
        )
        problems.append(
            Problem(
                "min_tokens",
                spec.controls.min_tokens,
                f"must be <= the request's budget ({budget}; vLLM's rule)",
                f"lower min_tokens, or send {spec.budget_field} >= {spec.controls.min_tokens}",
            )
        )
    if problems:
        raise ApiError(400, problems)


def _check_room(pipeline: ServedPipeline, prompt_ids: torch.Tensor, max_tokens: int, spec: GenerationRequest) -> None:
    """The CLI's n_positions rule, phrased for a client (who cannot resize the cache): it names the field the
    client can change and quotes only what the client sent, never the server's default as if it were sent."""
    try:
        pipeline.check_room(prompt_ids, max_tokens)
    except NeuronSSPError as exc:
        problem = exc.problems[0]
        if problem.field != "target.n_positions":
            raise ApiError(400, exc.problems) from None
        room = max_new_tokens_within(pipeline.target.n_positions, len(prompt_ids), pipeline.extra_slots)
        fixed = " (the server's target.n_positions is fixed when it starts)"
        prompt = Problem(spec.prompt_field, f"{len(prompt_ids)} tokens", problem.rule, "shorten the prompt" + fixed)
        if room < 1:
            raise ApiError(400, prompt) from None
        if spec.max_tokens is not None:
            raise ApiError(
                400,
                Problem(
                    spec.budget_field, spec.max_tokens, problem.rule, f"send {spec.budget_field} <= {room}" + fixed
                ),
            ) from None
        raise ApiError(
            400,
            replace(
                prompt,
                fix=f"send {spec.budget_field} <= {room} (without it the server's "
                f"default, {max_tokens}, applies), or shorten the prompt" + fixed,
            ),
        ) from None
