"""Prometheus metrics (text format at GET /metrics): ours (neuron_ssp_*), and under vLLM's own names, types,
labels and buckets the ones that mean what vLLM's do, so the Grafana dashboards vLLM ships read this server.

vLLM's are as vLLM 0.33.0 defines them (the PyPI wheel, commit 4ba787ec9): vllm/v1/metrics/loggers.py:499-1008
(labels model_name and engine; the scheduler, token, request and latency metrics), buckets.py:30-104 and
:171-203 (bucket families), vllm/v1/spec_decode/metrics.py:229-262 (speculative decoding), and what they count:
tokens as they are processed, one inter-token gap per output of a step however many tokens it carries
(vllm/v1/metrics/stats.py:509-558), a draft per request and step that scored draft tokens
(core/sched/scheduler.py:3305-3322), a request's timings when it finishes, whatever ended it (stats.py:585-616).

One registry per app, so two servers in one process (tests) never share counters.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)
TOKEN_GAP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0)
TOKENS_PER_CALL_BUCKETS = tuple(float(n) for n in range(1, 17))
BATCH_BUCKETS = (1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0, 64.0)
GOODPUT_BUCKETS = (10.0, 25.0, 50.0, 100.0, 200.0, 400.0, 800.0, 1600.0, 3200.0, 6400.0)

# vLLM 0.33.0's bucket families (vllm/v1/metrics/buckets.py:30, :57, :84)
VLLM_REQUEST_LATENCY_BUCKETS: tuple[float, ...] = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
)
VLLM_REQUEST_LATENCY_BUCKETS += (120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
VLLM_FIRST_TOKEN_BUCKETS: tuple[float, ...] = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
)
VLLM_FIRST_TOKEN_BUCKETS += (10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
VLLM_TOKEN_GAP_BUCKETS: tuple[float, ...] = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
)
VLLM_TOKEN_GAP_BUCKETS += (20.0, 40.0, 80.0)
VLLM_FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")  # vllm/v1/engine/__init__.py:37
# ours -> vLLM's: vLLM has no request timeout or drain cut; what its engine ends early is FINISHED_ABORTED, "abort"
# (vllm/v1/request.py:403-412; every running request at shutdown, vllm/v1/engine/core.py:1720-1726)
VLLM_REASON = {
    "stop": "stop",
    "length": "length",
    "abort": "abort",
    "timeout": "abort",
    "drain": "abort",
    "error": "error",
}


def one_two_five(limit: int) -> list[int]:
    """vLLM's token-count buckets: 1, 2, 5, 10, 20, 50, ... up to `limit` (build_1_2_5_buckets, buckets.py:195)."""
    buckets: list[int] = []
    scale = 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > limit:
                return buckets
            buckets.append(mantissa * scale)
        scale *= 10


class VllmMetrics:
    """vLLM's metrics that mean the same here, labelled with the served model name and engine "0" (one loop).
    `draft_positions`: draft tokens per call at most (k - 1); 0 when nothing drafts, and vLLM then has no
    speculative decoding metrics either."""

    def __init__(self, registry: CollectorRegistry, model_name: str, max_model_len: int, draft_positions: int):
        names, self.values = ["model_name", "engine"], (model_name, "0")

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, names, registry=registry).labels(*self.values)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, names, registry=registry).labels(*self.values)

        def histogram(name: str, doc: str, buckets: tuple[float, ...] | list[int]) -> Histogram:
            return Histogram(name, doc, names, buckets=buckets, registry=registry).labels(*self.values)

        self.running = gauge("vllm:num_requests_running", "Requests in the batch (rows of the loop).")
        self.waiting = gauge("vllm:num_requests_waiting", "Requests waiting in the queue.")
        self.kv_cache_usage = gauge(
            "vllm:kv_cache_usage_perc",
            "Batch slots in use over the serving batch (a slot holds one row's KV cache). 1 means every slot.",
        )
        self.prompt_tokens = counter("vllm:prompt_tokens", "Prompt tokens prefilled.")
        # vLLM's names and unit (tokens): the prompt tokens looked up in the prefix cache, and those found there
        self.prefix_cache_queries = counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.")
        self.prefix_cache_hits = counter("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache.")
        self.generation_tokens = counter("vllm:generation_tokens", "Tokens generated (past a stop string too).")
        success = Counter(
            "vllm:request_success",
            "Requests that ended, by finished_reason.",
            [*names, "finished_reason"],
            registry=registry,
        )
        self.success = {reason: success.labels(*self.values, reason) for reason in VLLM_FINISH_REASONS}
        tokens = one_two_five(max_model_len)
        self.request_prompt_tokens = histogram("vllm:request_prompt_tokens", "Prompt tokens per request.", tokens)
        self.request_generation_tokens = histogram(
            "vllm:request_generation_tokens", "Tokens generated per request.", tokens
        )
        self.request_max_generation_tokens = histogram(
            "vllm:request_max_num_generation_tokens", "Tokens generated per request (n is 1 here).", tokens
        )
        self.time_to_first_token = histogram(
            "vllm:time_to_first_token_seconds", "Arrival to first token.", VLLM_FIRST_TOKEN_BUCKETS
        )
        self.inter_token_latency = histogram(
            "vllm:inter_token_latency_seconds",
            "Time between a request's outputs (a step's output carries all the tokens it committed).",
            VLLM_TOKEN_GAP_BUCKETS,
        )
        self.e2e_latency = histogram(
            "vllm:e2e_request_latency_seconds", "Arrival to end, whatever ended it.", VLLM_REQUEST_LATENCY_BUCKETS
        )
        self.queue_time = histogram(
            "vllm:request_queue_time_seconds", "Arrival to joining the batch.", VLLM_REQUEST_LATENCY_BUCKETS
        )
        self.prefill_time = histogram(
            "vllm:request_prefill_time_seconds", "Joining the batch to the first token.", VLLM_REQUEST_LATENCY_BUCKETS
        )
        self.decode_time = histogram(
            "vllm:request_decode_time_seconds", "First token to last token.", VLLM_REQUEST_LATENCY_BUCKETS
        )
        self.drafts: Counter | None = None
        if draft_positions:
            self.drafts = counter("vllm:spec_decode_num_drafts", "Target calls of a request that scored drafts.")
            self.draft_tokens = counter("vllm:spec_decode_num_draft_tokens", "Draft tokens scored.")
            self.accepted_tokens = counter("vllm:spec_decode_num_accepted_tokens", "Draft tokens accepted.")
            self.accepted_at = Counter(
                "vllm:spec_decode_num_accepted_tokens_per_pos",
                "Accepted draft tokens per draft position.",
                [*names, "position"],
                registry=registry,
            )
            for position in range(draft_positions):
                self.accepted_at.labels(*self.values, str(position))

    def first_token(self, since_arrival_s: float, prompt_tokens: int, tokens: int) -> None:
        self.time_to_first_token.observe(since_arrival_s)
        self.prompt_tokens.inc(prompt_tokens)
        self.generation_tokens.inc(tokens)

    def step(self, gap_s: float, tokens: int, drafted: int, accepted: int | None) -> None:
        """One output of a decode step: its gap since the request's last output, its tokens, its draft (`accepted`
        None: the engine does not say which tokens were drafts)."""
        self.inter_token_latency.observe(gap_s)
        self.generation_tokens.inc(tokens)
        if self.drafts is None or not drafted or accepted is None:
            return
        self.drafts.inc()
        self.draft_tokens.inc(drafted)
        self.accepted_tokens.inc(accepted)
        for position in range(accepted):
            self.accepted_at.labels(*self.values, str(position)).inc()

    def finished(
        self,
        reason: str,
        e2e_s: float,
        queued_s: float,
        prompt_tokens: int,
        generated: int,
        prefill_decode_s: tuple[float, float] | None,
    ) -> None:
        """A request's end under our reason (VLLM_REASON maps it); `prefill_decode_s` None: no token came."""
        self.success[VLLM_REASON[reason]].inc()
        self.e2e_latency.observe(e2e_s)
        self.queue_time.observe(queued_s)
        self.request_prompt_tokens.observe(prompt_tokens)
        self.request_generation_tokens.observe(generated)
        self.request_max_generation_tokens.observe(generated)
        if prefill_decode_s is not None:
            self.prefill_time.observe(prefill_decode_s[0])
            self.decode_time.observe(prefill_decode_s[1])


class ServerMetrics:
    def __init__(self, model_name: str, max_model_len: int, draft_positions: int) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "neuron_ssp_requests",
            "Generation requests answered, by endpoint and HTTP status.",
            ["endpoint", "status"],
            registry=r,
        )
        self.finished = Counter(
            "neuron_ssp_request_success",
            "Requests that ended, by finished_reason: stop, length, abort (the client disconnected), "
            "timeout (request_timeout: 504), drain (cut or refused at SIGTERM) or error (the run failed).",
            ["finished_reason"],
            registry=r,
        )
        self.prompt_tokens = Counter("neuron_ssp_prompt_tokens", "Prompt tokens of finished requests.", registry=r)
        self.generation_tokens = Counter(
            "neuron_ssp_generation_tokens", "Tokens generated and returned (not those past a stop string).", registry=r
        )
        self.draft_tokens = Counter("neuron_ssp_draft_tokens", "Tokens proposed by the drafter.", registry=r)
        self.accepted_tokens = Counter("neuron_ssp_accepted_tokens", "Drafted tokens the target accepted.", registry=r)
        self.time_to_first_token = Histogram(
            "neuron_ssp_time_to_first_token_seconds",
            "Arrival to first generated token (queue wait included).",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.inter_token_latency = Histogram(
            "neuron_ssp_inter_token_latency_seconds",
            "Gap per output token after the first (a step's time split over the tokens it committed).",
            buckets=TOKEN_GAP_BUCKETS,
            registry=r,
        )
        self.e2e_latency = Histogram(
            "neuron_ssp_e2e_request_latency_seconds",
            "Arrival to last token of finished requests.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.tokens_per_call = Histogram(
            "neuron_ssp_accepted_tokens_per_target_call",
            "Tokens committed per decode-loop target call: accepted drafts + the "
            "target's own token (Spec-Bench's tau; prefill not counted).",
            buckets=TOKENS_PER_CALL_BUCKETS,
            registry=r,
        )
        self.queue_depth = Gauge("neuron_ssp_queue_depth", "Requests waiting for the generation worker.", registry=r)
        self.running = Gauge(
            "neuron_ssp_running_requests",
            "Requests being generated: rows of the batch (vLLM's num_requests_running).",
            registry=r,
        )
        self.batch_size = Histogram(
            "neuron_ssp_batch_size",
            "Rows (requests) in each step of the batching loop.",
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.step_goodput = Histogram(
            "neuron_ssp_step_goodput_tokens_per_second",
            "Tokens committed by a step of the batching loop per second of that step (TurboSpec's goodput).",
            buckets=GOODPUT_BUCKETS,
            registry=r,
        )
        self.prefix_pool_bytes = Gauge(
            "neuron_ssp_prefix_pool_bytes",
            "Host memory the prefix pool holds: whole blocks of committed keys and values (platform.prefix_pool_mb).",
            registry=r,
        )
        self.vllm = VllmMetrics(r, model_name, max_model_len, draft_positions)

    def watch(self, queue_depth: Callable[[], float], running: Callable[[], float], slots: int) -> None:
        """Gauges read at scrape time, so they can never drift from the worker's state."""
        self.queue_depth.set_function(queue_depth)
        self.running.set_function(running)
        self.vllm.waiting.set_function(queue_depth)
        self.vllm.running.set_function(running)
        self.vllm.kv_cache_usage.set_function(lambda: running() / slots)
