"""Prometheus metrics (text format at GET /metrics), named after vLLM's where one exists.

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


class ServerMetrics:
    def __init__(self) -> None:
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
            "Requests that ended, by finished_reason: stop, length, "
            "or abort (the client disconnected; vLLM's request_success_total).",
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

    def watch(self, queue_depth: Callable[[], float], running: Callable[[], float]) -> None:
        """Gauges read at scrape time, so they can never drift from the worker's state."""
        self.queue_depth.set_function(queue_depth)
        self.running.set_function(running)
