"""The generation thread: a scheduler that feeds requests as rows into our continuous-batching loop.

Requests wait in a FIFO queue; between two steps of the loop (engines/continuous_batch.py) the scheduler admits queued
requests while a slot is free (up to the pipeline's `max_batch` rows, what it was loaded for: serve/capacity.py's
`serving_batch`, serve.max_batch capped on Neuron by the compiled batch), then runs one step for every running row.
A row leaves at EOS, its budget, a stop string, a cancel or its deadline, and its slot takes the next request. The
same scheduler drives every engine's loop: ours, transformers-neuronx's static batches (engines/static_batch.py) and
NxD Inference's fused graph with continuous batching (engines/nxdi_fused.py) are each a RowLoop (engines/rows.py).

The server holds at most its slots plus serve.max_queue requests, counted from arrival to answer; one more is
refused at once (503 + Retry-After). A burst is counted the same way whatever the worker is doing when it
arrives: jobs move from the queue into slots only between two steps, so while a prefill or a step runs a slot
may be free with its job still in the queue, and the queue alone would have refused jobs the free slots take a
moment later. Every job the server took is counted once, when it ends, under what ended it (`finish`).

A job whose client left or whose `request_timeout` passed is cancelled at the loop's next step (its
`should_stop` hook), so its slot frees. A job whose prompt cannot even be prefilled before its deadline (at the
prefill cost the worker has measured) is answered 504 at once instead of being started: a prefill cannot be
interrupted, and starting it would make the other rows late too. After SIGTERM the running rows may go on for
`drain_timeout`; past that they are cancelled the same way and their clients get a final error. Events go back
to each request's event loop with `call_soon_threadsafe`.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TypeVar

import torch

from neuron_ssp.config import SamplingConfig
from neuron_ssp.engines.base import GenerationResult
from neuron_ssp.engines.rows import Row, RowCallbacks, RowLoop
from neuron_ssp.errors import NeuronSSPError, Problem, UsageError
from neuron_ssp.serve.errors import ApiError
from neuron_ssp.serve.metrics import ServerMetrics
from neuron_ssp.serve.served_pipeline import ServedPipeline
from neuron_ssp.serve.text import TextPiece, TokenLogprob, TokenText
from neuron_ssp.speculation.controls import RequestControls
from neuron_ssp.speculation.stats import GenerationStats

log = logging.getLogger("neuron_ssp.serve")
MIN_LOGPROB = -9999.0
T = TypeVar("T")


@dataclass
class Progress:
    """Running totals of the request so far (for live acceptance in the playground)."""

    drafted: int = 0
    accepted: int = 0
    target_calls: int = 0  # decode-loop calls (the prefill is not counted)
    tokens: int = 0


@dataclass
class Delta:
    pieces: list[TextPiece]
    progress: Progress
    logprobs: list[TokenLogprob] = field(default_factory=list)
    returned: int = 0  # tokens whose text has been handed out so far, these pieces included
    choice: int = 0  # the request's choice (of n) whose job sent it


@dataclass
class Done:
    text: str
    finish_reason: str  # "stop" | "length"
    completion_tokens: int  # tokens whose text is returned
    stats: GenerationStats
    seed: int | None = None  # what the sampler was seeded with (None: the engine samples on its own)
    logprobs: list[TokenLogprob] | None = None  # per returned token, when the request asked
    choice: int = 0


@dataclass
class Failed:
    error: ApiError
    choice: int = 0


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
    top_logprobs: int | None = None  # None: no logprobs; n: the chosen token and the n most likely
    controls: RequestControls = field(default_factory=RequestControls)
    include_stop_str: bool = False  # vLLM's include_stop_str_in_output
    choice: int = 0  # which of the request's n choices this job generates
    events: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)  # shared by the request's jobs
    released: bool = False  # its place given back (guarded by the worker's held_lock)
    cancelled: threading.Event = field(default_factory=threading.Event)
    client_gone: threading.Event = field(default_factory=threading.Event)  # cancelled because the client left
    arrived: float = field(default_factory=time.perf_counter)

    def emit(self, event: Event) -> None:
        event.choice = self.choice
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            self.cancelled.set()

    def abandoned(self) -> bool:
        return self.cancelled.is_set() or time.monotonic() > self.deadline

    def leave(self) -> None:
        """The client disconnected: cancel, and let the worker count the request as aborted."""
        self.client_gone.set()
        self.cancelled.set()


class JobGroup:
    """One request's jobs, a row of the batch per choice (`n`), answered from one event queue: what the routes
    wait on, cancel and time out together."""

    def __init__(self, jobs: list[Job], worker: GenerationWorker):
        self.jobs = jobs
        self.worker = worker
        self.events = jobs[0].events
        self.request_id = jobs[0].request_id
        self.deadline = jobs[0].deadline
        self.timeout_s = jobs[0].timeout_s
        self.client_seen = time.monotonic()  # when the route last found the client connected

    def leave(self) -> None:
        """The client disconnected: every job is cancelled as aborted, and the queued ones give their places back."""
        for job in self.jobs:
            job.leave()
        self.worker.give_back(self.jobs)

    def cancel(self) -> None:
        """The route is done with the request (answered, failed, timed out): jobs still going stop at the next step,
        queued ones give their places back."""
        for job in self.jobs:
            job.cancelled.set()
        self.worker.give_back(self.jobs)


class PrefillCost:
    """Seconds per prompt token of the prefill, measured on the longest prompt seen (the fixed cost per
    request weighs least there); 0 until a request has been measured."""

    def __init__(self) -> None:
        self.tokens = 0
        self.per_token_s = 0.0

    def observe(self, tokens: int, seconds: float) -> None:
        if tokens >= self.tokens:
            self.tokens, self.per_token_s = tokens, seconds / max(tokens, 1)

    def estimate(self, tokens: int) -> float:
        return self.per_token_s * tokens


class GenerationWorker:
    def __init__(self, pipeline: ServedPipeline, metrics: ServerMetrics, max_queue: int, retry_after_s: int = 1):
        self.pipeline = pipeline
        self.metrics = metrics
        self.queue: queue.Queue[Job | None] = queue.Queue()
        self.max_queue = max_queue
        self.retry_after_s = retry_after_s
        self.active: list[JobRun] = []
        self.accepting = True
        self.drain_deadline: float | None = None  # monotonic time past which running jobs are cut (SIGTERM)
        self.prefill = PrefillCost()
        self.max_rows = pipeline.max_batch  # the loop may hold more slots (a larger compiled batch)
        self.held = 0  # jobs submitted and not yet answered by the worker: queued, being joined or running
        self.held_lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, name="generation-worker", daemon=True)
        metrics.watch(self.queue.qsize, lambda: len(self.active), self.max_rows)

    @property
    def running(self) -> int:
        return len(self.active)

    def start(self) -> None:
        self.thread.start()

    @property
    def capacity(self) -> int:
        """Jobs the server holds at most: its rows plus its queue (a request with n choices takes n)."""
        return self.max_rows + self.max_queue

    def has_room(self, jobs: int) -> bool:
        """Whether `jobs` more fit beside what the server holds (its slots plus its queue)."""
        with self.held_lock:
            return self._fits(jobs)

    def _fits(self, jobs: int) -> bool:
        """The capacity rule, for a caller that holds held_lock."""
        return self.held + jobs <= self.capacity

    def submit(self, jobs: list[Job]) -> None:
        """Queue a request's jobs, or refuse them all at once when the server cannot hold them beside what it holds
        (its slots plus its queue)."""
        if not self.accepting:
            raise _unavailable(
                "the server is shutting down (SIGTERM)", "send the request to another instance", self.retry_after_s
            )
        with self.held_lock:
            if not self._fits(len(jobs)):
                raise _unavailable(
                    f"the queue is full: {self.max_rows} requests run at once and {self.max_queue} wait behind "
                    "them (serve.max_batch, serve.max_queue)",
                    f"retry after {self.retry_after_s} s, or raise serve.max_queue",
                    self.retry_after_s,
                )
            self.held += len(jobs)
        for job in jobs:
            self.queue.put_nowait(job)

    def finish(self, job: Job, reason: str, run: JobRun | None = None) -> None:
        """A held job's end, just before its last event: its place goes to the next request, and it is counted under
        what ended it (stop, length, abort, timeout, drain, error); `run` is None for a job that never started. A job
        whose place was given back (`give_back`) was counted then."""
        with self.held_lock:
            if job.released:
                return
            job.released = True
            self.held -= 1
        self._count(job, reason, run)

    def give_back(self, jobs: list[Job]) -> None:
        """A request nobody waits for any more (its client left, or its route gave up, its jobs cancelled): their
        places go to the next request now, not when the worker reaches them: a queued job is skipped then, a running
        one leaves at the next step. A request of n choices holds n places, and a client that leaves a stream would
        otherwise keep them a step or a queue's wait longer."""
        for job in jobs:
            with self.held_lock:
                if job.released:
                    continue
                job.released = True
                self.held -= 1
            gone, late = job.client_gone.is_set(), time.monotonic() > job.deadline
            self._count(job, "abort" if gone else "timeout" if late else "error", None)

    def _count(self, job: Job, reason: str, run: JobRun | None) -> None:
        self.metrics.finished.labels(reason).inc()
        now = time.perf_counter()
        prefill_decode = None
        if run is not None and run.first is not None:
            prefill_decode = (run.first - run.started, run.last - run.first)
        self.metrics.vllm.finished(
            reason,
            now - job.arrived,
            (run.started if run is not None else now) - job.arrived,
            int(job.prompt_ids.shape[0]),
            run.progress.tokens if run is not None else 0,
            prefill_decode,
        )

    def drain(self, grace_s: float = 0.0) -> None:
        """SIGTERM: refuse new work, fail the queued jobs, let the running ones go on for `grace_s` (idempotent:
        a second call keeps the first deadline)."""
        if not self.accepting:
            return
        self.accepting = False
        self.drain_deadline = time.monotonic() + grace_s
        while True:
            try:
                job = self.queue.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                self.finish(job, "drain")
                job.emit(
                    Failed(
                        _unavailable(
                            "the server is shutting down (SIGTERM)",
                            "send the request to another instance",
                            self.retry_after_s,
                        )
                    )
                )
        self.queue.put_nowait(None)  # the worker stops after the running jobs

    def stop(self, timeout_s: float) -> bool:
        """Drain (if not yet), cut the running jobs now, and wait for the thread; False if it is still busy."""
        self.drain(0.0)
        self.drain_deadline = min(self.drain_deadline or 0.0, time.monotonic())
        self.thread.join(timeout_s)
        return not self.thread.is_alive()

    def draining_past_deadline(self) -> bool:
        return self.drain_deadline is not None and time.monotonic() > self.drain_deadline

    def _run(self) -> None:
        """Admit queued jobs while slots are free (waiting for one only when nothing runs), then step."""
        loop = self.pipeline.row_loop()
        rows: dict[Row, JobRun] = {}
        stopping = False
        while not stopping or rows:
            while not stopping and loop.free_slots and len(rows) < self.max_rows:
                try:
                    job = self.queue.get(block=not rows)
                except queue.Empty:
                    break
                if job is None:
                    stopping = True
                    break
                self._join(loop, job, rows)
            if rows:
                self._step(loop, rows)

    def _join(self, loop: RowLoop, job: Job, rows: dict[Row, JobRun]) -> None:
        run = self._admit(job)
        if run is None:
            return
        request = self.pipeline.row_request(job.prompt_ids, job.max_tokens, job.sampling, run.callbacks(), job.controls)
        row, error = _outcome(partial(loop.join, request))
        if row is not None:
            self.metrics.vllm.prefix_cache_queries.inc(int(job.prompt_ids.shape[0]))
            self.metrics.vllm.prefix_cache_hits.inc(row.stats.cached_tokens)
        if row is not None and not row.finished:
            rows[row] = run
            self.active.append(run)
        else:
            run.end(*(_ended(row) if row is not None else (None, error)))

    def _step(self, loop: RowLoop, rows: dict[Row, JobRun]) -> None:
        self.metrics.batch_size.observe(len(loop.rows))
        committed = sum(row.seq.length for row in loop.rows)
        begin = time.perf_counter()
        finished = loop.step()
        seconds = time.perf_counter() - begin
        self.metrics.prefix_pool_bytes.set(loop.prefix_pool_bytes)
        committed = sum(row.seq.length for row in loop.rows + finished) - committed
        self.metrics.step_goodput.observe(committed / seconds if seconds > 0 else 0.0)
        for row in finished:
            run = rows.pop(row)
            self.active.remove(run)
            run.end(*_ended(row))

    def _admit(self, job: Job) -> JobRun | None:
        """The job's run, or None when it was answered without starting (abandoned, or too late to prefill)."""
        if job.released:  # given back: nobody waits for it
            return None
        error = timeout_error(job) if job.abandoned() else self._too_late(job)
        if error is None:
            return JobRun(self, job)
        self.finish(job, "abort" if job.client_gone.is_set() else "timeout")
        job.emit(Failed(error))
        return None

    def _too_late(self, job: Job) -> ApiError | None:
        """A 504 for a job whose prefill alone would outlast its deadline (it could only make others late)."""
        tokens = int(job.prompt_ids.shape[0])
        needed, left = self.prefill.estimate(tokens), job.deadline - time.monotonic()
        if needed <= left:
            return None
        log.info(
            "request %s not started: its prefill takes about %.1f s, %.1f s were left", job.request_id, needed, left
        )
        return ApiError(
            504,
            Problem(
                "request_timeout",
                job.timeout_s,
                f"the prompt's {tokens} tokens take about "
                f"{needed:.1f} s to prefill here ({self.prefill.per_token_s * 1000:.1f} ms per "
                f"token, measured), and only {max(left, 0):.1f} s of the request's time were left "
                "after its wait in the queue",
                "retry later, send a shorter prompt, or raise serve.request_timeout",
            ),
        )


def _outcome(call: Callable[[], T]) -> tuple[T | None, Exception | None]:
    """(call(), None), or (None, the exception): a request's failure is its own, never the worker's."""
    try:
        return call(), None
    except Exception as exc:  # mapped to the request's answer by JobRun.end
        return None, exc


def _ended(row: Row) -> tuple[GenerationResult | None, Exception | None]:
    return (None, row.error) if row.error is not None else (row.result(), None)


class JobRun:
    """One job being generated: the callbacks the loop calls, and the events and metrics they produce."""

    def __init__(self, worker: GenerationWorker, job: Job):
        self.worker = worker
        self.job = job
        self.text = TokenText(worker.pipeline.tokenizer, job.stop, job.include_stop_str)
        self.progress = Progress(target_calls=-1)
        self.started = time.perf_counter()  # when it joins the batch
        self.first: float | None = None  # its first token
        self.last = job.arrived  # its last output
        self.rows: list[torch.Tensor] = []  # the target's log-probabilities for the step being committed
        self.cut_by_drain = False

    def callbacks(self) -> RowCallbacks:
        return RowCallbacks(
            on_commit=self.on_commit,
            should_stop=self.should_stop,
            on_logits=self.on_logits if self.job.top_logprobs is not None else None,
        )

    def on_logits(self, logits: torch.Tensor) -> None:
        self.rows[:] = [logits.float().log_softmax(-1)]

    def on_commit(self, tokens: list[int], from_draft: int | None, drafted: int) -> None:
        job, metrics, progress = self.job, self.worker.metrics, self.progress
        now = time.perf_counter()
        if progress.target_calls < 0:
            metrics.time_to_first_token.observe(now - job.arrived)
            metrics.vllm.first_token(now - job.arrived, int(job.prompt_ids.shape[0]), len(tokens))
            self.worker.prefill.observe(int(job.prompt_ids.shape[0]), now - self.started)
            self.first = now
        else:
            for _ in tokens:
                metrics.inter_token_latency.observe((now - self.last) / len(tokens))
            metrics.tokens_per_call.observe(len(tokens))
            metrics.vllm.step(now - self.last, len(tokens), drafted, from_draft)
        self.last = now
        origins = (
            ["unknown"] * len(tokens)
            if from_draft is None
            else ["draft"] * from_draft + ["target"] * (len(tokens) - from_draft)
        )
        for i, (token, origin) in enumerate(zip(tokens, origins, strict=True)):
            self.text.add(token, origin, self._logprob(self.rows[0][i], token) if self.rows else None)
        progress.target_calls += 1
        progress.drafted += drafted
        progress.accepted += from_draft or 0
        progress.tokens += len(tokens)
        pieces, logprobs = self.text.take(), self.text.take_logprobs()
        job.emit(Delta(pieces, Progress(**vars(progress)), logprobs, self.text.sent_tokens))

    def should_stop(self) -> bool:
        self.cut_by_drain = self.worker.draining_past_deadline()
        return self.text.stopped or self.job.abandoned() or self.cut_by_drain

    def end(self, result: GenerationResult | None, error: Exception | None) -> None:
        """The job's last events: its final text (or what cut it short), or the error it met."""
        job = self.job
        if result is None:
            self._fail(error)
            return
        if not self.text.stopped and (job.abandoned() or self.cut_by_drain):
            self._end_cut(len(result.tokens))
            return
        returned = self.text.returned_tokens
        self._count(result.stats, returned)
        pieces, logprobs = self.text.take(final=True), self.text.take_logprobs(final=True)
        if pieces or logprobs:
            job.emit(Delta(pieces, Progress(**vars(self.progress)), logprobs, self.text.sent_tokens))
        pipeline = self.worker.pipeline
        ending = set(job.controls.stop_token_ids) | (set() if job.controls.ignore_eos else pipeline.eos_token_ids)
        ended_by_model = bool(result.tokens) and result.tokens[-1] in ending
        reason = "stop" if self.text.stopped or ended_by_model else "length"
        self.worker.finish(job, reason, self)
        sampled = job.sampling.temperature > 0 and pipeline.config.speculation.engine != "fused"
        seed = job.sampling.seed if sampled else None  # greedy uses none; fused seeds on the device
        job.emit(
            Done(
                self.text.text,
                reason,
                returned,
                result.stats,
                seed,
                self.text.logprobs[:returned] if job.top_logprobs is not None else None,
            )
        )

    def _fail(self, error: Exception | None) -> None:
        job = self.job
        self.worker.finish(job, "error", self)
        if isinstance(error, UsageError):  # the request asked for something this pipeline cannot do
            job.emit(Failed(ApiError(400, error.problems)))
        elif isinstance(error, NeuronSSPError):  # the request was fine; the run failed (non-finite logits...)
            log.error("request %s failed: %s", job.request_id, error)
            job.emit(Failed(ApiError(500, error.problems)))
        else:
            log.error("request %s failed", job.request_id, exc_info=error)
            job.emit(
                Failed(
                    ApiError(
                        500,
                        Problem(
                            "request",
                            job.request_id,
                            "the server failed while generating",
                            "retry; if it persists, report the request id to the operator "
                            "(the server log holds the details)",
                        ),
                    )
                )
            )

    def _end_cut(self, generated: int) -> None:
        """A job cut short: by its client leaving (counted as aborted), its deadline, or the end of the drain."""
        job, worker = self.job, self.worker
        if job.client_gone.is_set():
            worker.finish(job, "abort", self)
            log.info("request %s cancelled after %d tokens: the client disconnected", job.request_id, generated)
            return
        if self.cut_by_drain:
            worker.finish(job, "drain", self)
            log.info("request %s cut after %d tokens: drain_timeout passed after SIGTERM", job.request_id, generated)
            job.emit(
                Failed(
                    _unavailable(
                        "the server shut down (SIGTERM) before the request finished: serve.drain_timeout passed",
                        "send the request to another instance",
                        worker.retry_after_s,
                    )
                )
            )
            return
        worker.finish(job, "timeout", self)
        job.emit(Failed(timeout_error(job)))

    def _logprob(self, row: torch.Tensor, token: int) -> TokenLogprob:
        """`row`: the target's log-probabilities; -inf is sent as MIN_LOGPROB (JSON has no infinity; vLLM's value)."""
        tokenizer, top = self.worker.pipeline.tokenizer, self.job.top_logprobs

        def decode(ids: list[int]) -> str:
            return str(tokenizer.decode(ids))

        best = row.topk(min(top, row.shape[-1])) if top else None
        alternatives = (
            []
            if best is None
            else [
                (decode([int(i)]), max(float(v), MIN_LOGPROB)) for v, i in zip(best.values, best.indices, strict=True)
            ]
        )
        return TokenLogprob(decode([token]), max(float(row[token]), MIN_LOGPROB), alternatives)

    def _count(self, stats: GenerationStats, returned: int) -> None:
        metrics = self.worker.metrics
        metrics.prompt_tokens.inc(int(self.job.prompt_ids.shape[0]))
        metrics.generation_tokens.inc(returned)
        metrics.draft_tokens.inc(stats.draft_tokens)
        metrics.accepted_tokens.inc(stats.accepted_tokens)
        metrics.e2e_latency.observe(time.perf_counter() - self.job.arrived)


def _unavailable(rule: str, fix: str, retry_after_s: int) -> ApiError:
    return ApiError(503, Problem("server", "busy", rule, fix), headers={"Retry-After": str(retry_after_s)})


def timeout_error(job: Job | JobGroup) -> ApiError:
    return ApiError(
        504,
        Problem(
            "request_timeout",
            job.timeout_s,
            "the request did not finish within the server's request_timeout (queue wait included)",
            "retry later, ask for fewer max_tokens, or raise serve.request_timeout",
        ),
    )
