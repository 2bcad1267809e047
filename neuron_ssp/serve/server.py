"""Start-up and shutdown: load and validate the pipeline before the port opens, then run uvicorn.

SIGTERM (how SageMaker and systemd stop a container): stop accepting, refuse the queued requests
(503), let the running ones finish within `drain_timeout`; past that the worker cancels them at their next
iteration and their clients get a final error (an SSE error chunk, or a 503). The port stays open while
they run, so /ping and /health answer 503 (a load balancer's health check sees the drain, not a refused
connection) and a new request gets a 503 with Retry-After. Then uvicorn closes the port, waits for the
open connections within what is left of `drain_timeout` plus FINAL_ERROR_S (so it never cuts a connection
before that final error is written), the worker thread is joined and the process exits 0.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from dataclasses import dataclass
from types import FrameType

import uvicorn

from neuron_ssp.config import SAGEMAKER_INVOKE_LIMIT, Config, ServeConfig
from neuron_ssp.errors import Problem, UsageError
from neuron_ssp.pipeline.load import load_pipeline
from neuron_ssp.pipeline.pipeline import Pipeline
from neuron_ssp.serve.app import create_app
from neuron_ssp.serve.capacity import ServingBatch, serving_batch_of
from neuron_ssp.serve.worker import GenerationWorker

log = logging.getLogger("neuron_ssp.serve")
SAGEMAKER_HOST, SAGEMAKER_PORT = "0.0.0.0", 8080  # the SageMaker container contract
DEFAULT_HOST, DEFAULT_PORT = "127.0.0.1", 8000
FINAL_ERROR_S = 5.0  # after drain_timeout: time for the cut request's final error to reach its client


@dataclass
class Listen:
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


@dataclass
class Serving:
    """What a server starts with, read from its config once, before the models load: where it listens, the key its
    clients must send (a key asked for and missing is refused then), the model name they send and how many requests
    it runs at once."""

    listen: Listen
    api_key: str | None
    model_name: str
    batch: ServingBatch


def serving(config: Config) -> Serving:
    settings = config.serve
    return Serving(
        listen_address(settings), read_api_key(settings), served_model_name(config), serving_batch_of(config)
    )


def listen_address(settings: ServeConfig) -> Listen:
    """--sagemaker means 0.0.0.0:8080; an explicit host or port still wins."""
    host = settings.host or (SAGEMAKER_HOST if settings.sagemaker else DEFAULT_HOST)
    port = settings.port or (SAGEMAKER_PORT if settings.sagemaker else DEFAULT_PORT)
    return Listen(host, port)


def read_api_key(settings: ServeConfig) -> str | None:
    if settings.api_key_env is None:
        return None
    key = os.environ.get(settings.api_key_env, "")
    if not key:
        raise UsageError(
            Problem(
                "serve.api_key_env",
                settings.api_key_env,
                "this environment variable is unset or empty, so the server would run without the key you asked for",
                f"export {settings.api_key_env}=<key>, or leave --api-key-env out",
            )
        )
    return key


def served_model_name(config: Config) -> str:
    """What clients send as `model`: the configured name, else the target's name without its prefix."""
    if config.serve.served_model_name:
        return config.serve.served_model_name
    return config.target.path.removeprefix("embedded:").rstrip("/").rsplit("/", 1)[-1]


def log_serving_batch(batch: ServingBatch) -> None:
    """Say when the server runs fewer requests at once than serve.max_batch asks: a warning where the user set
    it (validate refuses that on Neuron; a server given a pipeline directly still says it), an info line where it
    is the default (8, the torch backend's), which no Neuron config compiled for batch 1 should have to change."""
    if batch.problem is not None:
        log.log(logging.WARNING if batch.asked else logging.INFO, "%s", batch.problem)


class _DrainingServer(uvicorn.Server):
    """uvicorn's graceful shutdown, after a drain: the first signal makes the worker refuse new work and keeps
    the port open (answering 503) until the running requests are done; then uvicorn shuts down as usual."""

    def __init__(self, config: uvicorn.Config, worker: GenerationWorker, drain_timeout: float):
        super().__init__(config)
        self.worker = worker
        self.drain_timeout = drain_timeout

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.worker.accepting and not self.should_exit:
            log.info(
                "signal %s: draining (the running requests have %.0f s to finish; /ping, /health and new "
                "requests answer 503 meanwhile)",
                sig,
                self.drain_timeout,
            )
            self.worker.drain(self.drain_timeout)
            threading.Thread(target=self._exit_when_drained, args=(sig, frame), name="drain", daemon=True).start()
            return
        super().handle_exit(sig, frame)  # a second signal: shut down now (a third one: force)

    def _exit_when_drained(self, sig: int, frame: FrameType | None) -> None:
        """Wait until no request is generating or answering (the worker cuts its jobs at drain_timeout), then
        let uvicorn close the port, with the time left of the old bound for the open connections."""
        deadline = time.monotonic() + self.drain_timeout + FINAL_ERROR_S
        while (self.worker.running or self.server_state.tasks) and time.monotonic() < deadline:
            time.sleep(0.05)
        # uvicorn hands it to asyncio.wait_for, which takes seconds as a float (its annotation says int)
        self.config.timeout_graceful_shutdown = max(deadline - time.monotonic(), 1.0)  # type: ignore[assignment]
        if not self.should_exit:
            super().handle_exit(sig, frame)


def run_server(config: Config, pipeline: Pipeline | None = None, started: Serving | None = None) -> None:
    """Serve `pipeline` (loaded here for `started`'s batch when not given) with `started`'s address and key
    (`started` read here when not given)."""
    settings = config.serve
    started = started or serving(config)
    log_serving_batch(started.batch)
    pipeline = pipeline or load_pipeline(config, started.batch.rows)
    name = started.model_name
    app = create_app(pipeline, settings, name, started.api_key)
    log.info(
        "model '%s' loaded; batch %d, queue %d, request_timeout %.0f s, drain_timeout %.0f s, api key %s",
        name,
        pipeline.max_batch,
        settings.max_queue,
        settings.timeout_s,
        settings.drain_timeout,
        "required" if started.api_key else "off",
    )
    if settings.sagemaker and settings.timeout_s >= SAGEMAKER_INVOKE_LIMIT:
        log.warning(
            "request_timeout %.0f s: a real-time SageMaker invocation is cut at %.0f s, so longer requests "
            "end with SageMaker's ModelError instead of this server's 504",
            settings.timeout_s,
            SAGEMAKER_INVOKE_LIMIT,
        )
    log.info(
        "serving on %s (OpenAI API under /v1, playground at /, metrics at /metrics, API at /docs)", started.listen.url
    )
    server = _DrainingServer(
        uvicorn.Config(
            app,
            host=started.listen.host,
            port=started.listen.port,
            log_level="info",
            timeout_graceful_shutdown=settings.drain_timeout + FINAL_ERROR_S,  # type: ignore[arg-type]  # a float
            access_log=False,
        ),
        app.state.worker,
        settings.drain_timeout,
    )
    # uvicorn re-raises the signal it caught once it has shut down; the drain is done by then, so the
    # default action (death by SIGTERM) is replaced by a normal return: exit code 0
    signal.signal(signal.SIGTERM, lambda *_: None)
    server.run()
