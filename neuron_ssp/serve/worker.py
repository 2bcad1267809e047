"""One generation thread fed by a bounded FIFO queue: speculation is batch 1 and a model pair is not
thread-safe, so requests run one at a time, in arrival order.

A full queue is refused at once (503 + Retry-After); a job whose client left or whose
`request_timeout` passed is cancelled at the generator's next iteration (its `should_stop` hook), so
the worker moves on. A job whose prompt cannot even be prefilled before its deadline (at the prefill
cost the worker has measured) is answered 504 at once instead of being started: a prefill cannot be
interrupted, and starting it would make the jobs behind it late too. After SIGTERM the running job may
go on for `drain_timeout`; past that it is cancelled the same way and its client gets a final error.
Events go back to the request's event loop with `call_soon_threadsafe`.
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
from neuron_ssp.serve.text import Piece, TokenLogprob, TokenText
from neuron_ssp.speculation.stats import GenerationStats

log = logging.getLogger("neuron_ssp.serve")
MIN_LOGPROB = -9999.0


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
    logprobs: list[TokenLogprob] = field(default_factory=list)


@dataclass
class Done:
    text: str
    finish_reason: str  # "stop" | "length"
    completion_tokens: int  # tokens whose text is returned
    stats: GenerationStats
    seed: int | None = None  # what the sampler was seeded with (None: the engine samples on its own)
    logprobs: list[TokenLogprob] | None = None  # per returned token, when the request asked


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
    top_logprobs: int | None = None  # None: no logprobs; n: the chosen token and the n most likely
    events: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    client_gone: threading.Event = field(default_factory=threading.Event)  # cancelled because the client left
    arrived: float = field(default_factory=time.perf_counter)
    client_seen: float = field(default_factory=time.monotonic)  # when the route last found the client connected

    def emit(self, event: Event) -> None:
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
    def __init__(self, pipeline: Pipeline, metrics: ServerMetrics, max_queue: int, retry_after_s: int = 1):
        self.pipeline = pipeline
        self.metrics = metrics
        self.queue: queue.Queue[Job | None] = queue.Queue(maxsize=max_queue)
        self.retry_after_s = retry_after_s
        self.running: Job | None = None
        self.accepting = True
        self.drain_deadline: float | None = None  # monotonic time past which a running job is cut (SIGTERM)
        self.prefill = PrefillCost()
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

    def drain(self, grace_s: float = 0.0) -> None:
        """SIGTERM: refuse new work, fail the queued jobs, let the running one go on for `grace_s` (idempotent:
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
                job.emit(Failed(_unavailable("the server is shutting down (SIGTERM)",
                                             "send the request to another instance", self.retry_after_s)))
        self.queue.put_nowait(None)  # just emptied, so there is room: the worker stops after the running job

    def stop(self, timeout_s: float) -> bool:
        """Drain (if not yet), cut the running job now, and wait for the thread; False if it is still busy."""
        self.drain(0.0)
        self.drain_deadline = min(self.drain_deadline or 0.0, time.monotonic())
        self.thread.join(timeout_s)
        return not self.thread.is_alive()

    def draining_past_deadline(self) -> bool:
        return self.drain_deadline is not None and time.monotonic() > self.drain_deadline

    def _run(self) -> None:
        while (job := self.queue.get()) is not None:
            if job.abandoned():
                self._end_unstarted(job, timeout_error(job))
                continue
            late = self._too_late(job)
            if late is not None:
                self._end_unstarted(job, late)
                continue
            self.running = job
            try:
                self._generate(job)
            finally:
                self.running = None

    def _end_unstarted(self, job: Job, error: ApiError) -> None:
        if job.client_gone.is_set():
            self.metrics.finished.labels("abort").inc()
        job.emit(Failed(error))

    def _too_late(self, job: Job) -> ApiError | None:
        """A 504 for a job whose prefill alone would outlast its deadline (it could only make others late)."""
        tokens = int(job.prompt_ids.shape[0])
        needed, left = self.prefill.estimate(tokens), job.deadline - time.monotonic()
        if needed <= left:
            return None
        log.info("request %s not started: its prefill takes about %.1f s, %.1f s were left", job.request_id,
                 needed, left)
        return ApiError(504, Problem("request_timeout", job.timeout_s, f"the prompt's {tokens} tokens take about "
                                     f"{needed:.1f} s to prefill here ({self.prefill.per_token_s * 1000:.1f} ms per "
                                     f"token, measured), and only {max(left, 0):.1f} s of the request's time were left "
                                     "after its wait in the queue", "retry later, send a shorter prompt, or raise "
                                     "serve.request_timeout"))

    def _generate(self, job: Job) -> None:
        text = TokenText(self.pipeline.tokenizer, job.stop)
        progress = Progress(target_calls=-1)
        started = time.perf_counter()
        last = [job.arrived]
        rows: list[torch.Tensor] = []  # the target's log-probabilities for the step being committed
        cut_by_drain = [False]

        def on_logits(logits: torch.Tensor) -> None:
            rows[:] = [logits.float().log_softmax(-1)]

        def on_commit(tokens: list[int], from_draft: int | None, drafted: int) -> None:
            now = time.perf_counter()
            if progress.target_calls < 0:
                self.metrics.time_to_first_token.observe(now - job.arrived)
                self.prefill.observe(int(job.prompt_ids.shape[0]), now - started)
            else:
                for _ in tokens:
                    self.metrics.inter_token_latency.observe((now - last[0]) / len(tokens))
                self.metrics.tokens_per_call.observe(len(tokens))
            last[0] = now
            origins = ["unknown"] * len(tokens) if from_draft is None else \
                ["draft"] * from_draft + ["target"] * (len(tokens) - from_draft)
            for i, (token, origin) in enumerate(zip(tokens, origins, strict=True)):
                text.add(token, origin, self._logprob(rows[0][i], token, job.top_logprobs) if rows else None)
            progress.target_calls += 1
            progress.drafted += drafted
            progress.accepted += from_draft or 0
            progress.tokens += len(tokens)
            job.emit(Delta(text.take(), Progress(**vars(progress)), text.take_logprobs()))

        def should_stop() -> bool:
            cut_by_drain[0] = self.draining_past_deadline()
            return text.stopped or job.abandoned() or cut_by_drain[0]

        try:
            result = self.pipeline.generate_ids(job.prompt_ids, job.max_tokens, job.sampling, on_commit,
                                                should_stop=should_stop,
                                                on_logits=on_logits if job.top_logprobs is not None else None)
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
        if not text.stopped and (job.abandoned() or cut_by_drain[0]):
            self._end_cut(job, len(result.tokens), cut_by_drain[0])
            return
        returned = text.returned_tokens
        self._count(job, result.stats, returned)
        pieces, logprobs = text.take(final=True), text.take_logprobs(final=True)
        if pieces or logprobs:
            job.emit(Delta(pieces, Progress(**vars(progress)), logprobs))
        ended_by_model = bool(result.tokens) and result.tokens[-1] in self.pipeline.eos_token_ids
        reason = "stop" if text.stopped or ended_by_model else "length"
        self.metrics.finished.labels(reason).inc()
        seed = job.sampling.seed if self.pipeline.config.speculation.engine != "fused" else None
        job.emit(Done(text.text, reason, returned, result.stats, seed,
                      text.logprobs[:returned] if job.top_logprobs is not None else None))

    def _end_cut(self, job: Job, generated: int, by_drain: bool) -> None:
        """A job cut short: by its client leaving (counted as aborted), its deadline, or the end of the drain."""
        if job.client_gone.is_set():
            self.metrics.finished.labels("abort").inc()
            log.info("request %s cancelled after %d tokens: the client disconnected", job.request_id, generated)
            return
        if by_drain:
            log.info("request %s cut after %d tokens: drain_timeout passed after SIGTERM", job.request_id, generated)
            job.emit(Failed(_unavailable("the server shut down (SIGTERM) before the request finished: "
                                         "serve.drain_timeout passed", "send the request to another instance",
                                         self.retry_after_s)))
            return
        job.emit(Failed(timeout_error(job)))

    def _logprob(self, row: torch.Tensor, token: int, top: int | None) -> TokenLogprob:
        """`row`: the target's log-probabilities; -inf is sent as MIN_LOGPROB (JSON has no infinity; vLLM's value)."""
        decode = self.pipeline.tokenizer.decode
        best = row.topk(min(top, row.shape[-1])) if top else None
        alternatives = [] if best is None else \
            [(decode([int(i)]), max(float(v), MIN_LOGPROB)) for v, i in zip(best.values, best.indices, strict=True)]
        return TokenLogprob(decode([token]), max(float(row[token]), MIN_LOGPROB), alternatives)

    def _count(self, job: Job, stats: GenerationStats, returned: int) -> None:
        self.metrics.prompt_tokens.inc(int(job.prompt_ids.shape[0]))
        self.metrics.generation_tokens.inc(returned)
        self.metrics.draft_tokens.inc(stats.draft_tokens)
        self.metrics.accepted_tokens.inc(stats.accepted_tokens)
        self.metrics.e2e_latency.observe(time.perf_counter() - job.arrived)


def _unavailable(rule: str, fix: str, retry_after_s: int) -> ApiError:
    return ApiError(503, Problem("server", "busy", rule, fix), headers={"Retry-After": str(retry_after_s)})


def timeout_error(job: Job) -> ApiError:
    return ApiError(504, Problem("request_timeout", job.timeout_s, "the request did not finish within the "
                                 "server's request_timeout (queue wait included)",
                                 "retry later, ask for fewer max_tokens, or raise serve.request_timeout"))
