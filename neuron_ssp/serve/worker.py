"""One generation thread fed by a bounded FIFO queue: speculation is batch 1 and a model pair is not
thread-safe, so requests run one at a time, in arrival order.

A full queue is refused at once (503 + Retry-After); a job whose client left or whose
`request_timeout` passed is cancelled at the generator's next iteration (its `should_stop` hook), so
the worker moves on. Events go back to the request's event loop with `call_soon_threadsafe`.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from dataclasses import dataclass, field

import torch

from neuron_ssp.config import SamplingConfig
from neuron_ssp.errors import NeuronSSPError, Problem, UsageError
from neuron_ssp.pipeline.pipeline import Pipeline
from neuron_ssp.serve.errors import ApiError
from neuron_ssp.serve.metrics import ServerMetrics
from neuron_ssp.serve.text import Piece, TokenText
from neuron_ssp.speculation.stats import GenerationStats

log = logging.getLogger("neuron_ssp.serve")


@dataclass
class Progress:
    """Running totals of the request so far (for live acceptance in the playground)."""

    drafted: int = 0
    accepted: int = 0
    target_calls: int = 0  # decode-loop calls (the prefill is not counted)
    tokens: int = 0


@dataclass
class Delta:
    pieces: list[Piece]
    progress: Progress


@dataclass
class Done:
    text: str
    finish_reason: str  # "stop" | "length"
    completion_tokens: int
    stats: GenerationStats


@dataclass
class Failed:
    error: ApiError


Event = Delta | Done | Failed


@dataclass
class Job:
    request_id: str
    prompt_ids: torch.Tensor
    max_tokens: int
    sampling: SamplingConfig
    stop: list[str]
    deadline: float  # time.monotonic() after which the job is abandoned
    timeout_s: float
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    arrived: float = field(default_factory=time.perf_counter)
    client_seen: float = field(default_factory=time.monotonic)  # when the route last found the client connected

    def emit(self, event: Event) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            self.cancelled.set()

    def abandoned(self) -> bool:
        return self.cancelled.is_set() or time.monotonic() > self.deadline


class GenerationWorker:
    def __init__(self, pipeline: Pipeline, metrics: ServerMetrics, max_queue: int, retry_after_s: int = 1):
        self.pipeline = pipeline
        self.metrics = metrics
        self.queue: queue.Queue[Job | None] = queue.Queue(maxsize=max_queue)
        self.retry_after_s = retry_after_s
        self.running: Job | None = None
        self.accepting = True
        self.thread = threading.Thread(target=self._run, name="generation-worker", daemon=True)
        metrics.watch(self.queue.qsize, lambda: 1 if self.running else 0)

    def start(self) -> None:
        self.thread.start()

    def submit(self, job: Job) -> None:
        """Queue a job, or refuse it at once: nothing waits for a slot."""
        if not self.accepting:
            raise _unavailable("the server is shutting down (SIGTERM)", "send the request to another instance",
                               self.retry_after_s)
        try:
            self.queue.put_nowait(job)
        except queue.Full:
            raise _unavailable(f"the queue is full ({self.queue.maxsize} requests wait behind the running one)",
                               f"retry after {self.retry_after_s} s, or raise serve.max_queue",
                               self.retry_after_s) from None

    def drain(self) -> None:
        """SIGTERM: refuse new work, fail the queued jobs, let the running one finish (idempotent)."""
        if not self.accepting:
            return
        self.accepting = False
        while True:
            try:
                job = self.queue.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.emit(Failed(_unavailable("the server is shutting down (SIGTERM)",
                                             "send the request to another instance", self.retry_after_s)))
        self.queue.put_nowait(None)  # just emptied, so there is room: the worker stops after the running job

    def _run(self) -> None:
        while (job := self.queue.get()) is not None:
            if job.abandoned():
                job.emit(Failed(timeout_error(job)))
                continue
            self.running = job
            try:
                self._generate(job)
            finally:
                self.running = None

    def _generate(self, job: Job) -> None:
        text = TokenText(self.pipeline.tokenizer, job.stop)
        progress = Progress(target_calls=-1)
        last = [job.arrived]

        def on_commit(tokens: list[int], from_draft: int | None, drafted: int) -> None:
            now = time.perf_counter()
            if progress.target_calls < 0:
                self.metrics.time_to_first_token.observe(now - job.arrived)
            else:
                for _ in tokens:
                    self.metrics.inter_token_latency.observe((now - last[0]) / len(tokens))
                self.metrics.tokens_per_call.observe(len(tokens))
            last[0] = now
            origins = ["unknown"] * len(tokens) if from_draft is None else \
                ["draft"] * from_draft + ["target"] * (len(tokens) - from_draft)
            for token, origin in zip(tokens, origins, strict=True):
                text.add(token, origin)
            progress.target_calls += 1
            progress.drafted += drafted
            progress.accepted += from_draft or 0
            progress.tokens += len(tokens)
            job.emit(Delta(text.take(), Progress(**vars(progress))))

        try:
            result = self.pipeline.generate_ids(job.prompt_ids, job.max_tokens, job.sampling, on_commit,
                                                should_stop=lambda: text.stopped or job.abandoned())
        except UsageError as exc:  # the request asked for something this pipeline cannot do
            job.emit(Failed(ApiError(400, exc.problems)))
            return
        except NeuronSSPError as exc:  # the request was fine; the server failed at run time (non-finite logits...)
            log.error("request %s failed: %s", job.request_id, exc)
            job.emit(Failed(ApiError(500, exc.problems)))
            return
        except Exception:
            log.exception("request %s failed", job.request_id)
            job.emit(Failed(ApiError(500, Problem("request", job.request_id, "the server failed while generating",
                                                  "retry; if it persists, report the request id to the operator "
                                                  "(the server log holds the details)"))))
            return
        if job.abandoned() and not text.stopped:
            job.emit(Failed(timeout_error(job)))
            return
        self._count(job, result.stats, len(result.tokens))
        pieces = text.take(final=True)
        if pieces:
            job.emit(Delta(pieces, Progress(**vars(progress))))
        ended_by_model = bool(result.tokens) and result.tokens[-1] in self.pipeline.eos_token_ids
        reason = "stop" if text.stopped or ended_by_model else "length"
        job.emit(Done(text.text, reason, len(result.tokens), result.stats))

    def _count(self, job: Job, stats: GenerationStats, generated: int) -> None:
        self.metrics.prompt_tokens.inc(int(job.prompt_ids.shape[0]))
        self.metrics.generation_tokens.inc(generated)
        self.metrics.draft_tokens.inc(stats.draft_tokens)
        self.metrics.accepted_tokens.inc(stats.accepted_tokens)
        self.metrics.e2e_latency.observe(time.perf_counter() - job.arrived)


def _unavailable(rule: str, fix: str, retry_after_s: int) -> ApiError:
    return ApiError(503, Problem("server", "busy", rule, fix), headers={"Retry-After": str(retry_after_s)})


def timeout_error(job: Job) -> ApiError:
    return ApiError(504, Problem("request_timeout", job.timeout_s, "the request did not finish within the "
                                 "server's request_timeout (queue wait included)",
                                 "retry later, ask for fewer max_tokens, or raise serve.request_timeout"))
