"""How many requests a server runs at once for a config: the one rule the server and SageMaker autoscaling share.

The torch backend with our loop batches any number of rows (its KV cache is allocated for serve.max_batch).
On Neuron the shapes are compiled, so a loop runs at most the batch the target was compiled for
(`target.batch_size`), and only where the engine takes a batch: the `batch` column of topology/batch_rules.py,
each cell with its source (transformers-neuronx 0.13: native, library and fused, speculation.py:718-730 and
fused_speculation.py:555-560 at 1ade6d7; NxD Inference: fused only, "Speculative decoding with a draft model
currently supports only batch sizes of 1", aws-neuron-sdk feature-guide.rst:516 at 81ce03ae). The row read is the
batched generation's: where an older transformers-neuronx is installed, validate refuses batch_size > 1, so such a
config never reaches a server. Whether the libraries accept that batch (SDK, sampling, continuous batching) is
validate's rule; this module only says how many run at once.
"""

from __future__ import annotations

from dataclasses import dataclass

from neuron_ssp.config import Config
from neuron_ssp.errors import Problem
from neuron_ssp.topology.batch_rules import BatchRule, generation_of, rule_for


@dataclass(frozen=True)
class ServingBatch:
    """Requests a server runs at once for a config (`rows`), why (`reason`), and `problem` where serve.max_batch
    asks for more: the server runs `rows` and queues the rest. `asked`: whether the config sets serve.max_batch (a
    user's request, not the default)."""

    rows: int
    reason: str
    problem: Problem | None
    asked: bool = False


def serving_batch_of(config: Config) -> ServingBatch:
    rows, reason = _serving_batch(config)
    asked = "max_batch" in config.serve.model_fields_set
    return ServingBatch(rows, reason, _max_batch_problem(config, rows, reason), asked)


def serving_batch(config: Config) -> int:
    """Requests the server runs at once; the others wait in its queue (serve.max_queue)."""
    return _serving_batch(config)[0]


def serving_batch_reason(config: Config) -> str:
    """Why `serving_batch` is what it is, in words for a log line or a plan."""
    return _serving_batch(config)[1]


def _max_batch_problem(config: Config, rows: int, reason: str) -> Problem | None:
    """serve.max_batch above `rows`, what the server will run."""
    if config.serve.max_batch <= rows:
        return None
    if rows > 1:  # a batching engine, capped by the compiled batch
        fix = (
            f"set serve.max_batch: {rows}, or compile the target for a larger batch (target.batch_size, "
            "then `neuron-ssp compile`)"
        )
    elif config.platform.backend == "neuron" and _batching_rule(config) is not None:
        fix = (
            "set serve.max_batch: 1, or compile the target for a batch (target.batch_size > 1, then "
            "`neuron-ssp compile`)"
        )
    else:
        fix = "set serve.max_batch: 1, or use an engine that batches (see docs/serving.md)"
    return Problem(
        "serve.max_batch",
        config.serve.max_batch,
        f"the server runs {rows} request(s) at once: {reason}; the others wait in its queue",
        fix,
    )


def _batching_rule(config: Config) -> BatchRule | None:
    """The engine's row of the batch table where it runs a batch > 1 on Neuron; None where it serves one."""
    library = config.neuron.library
    rule = rule_for(library, config.speculation.engine, generation_of(library))
    return rule if rule is not None and rule.batch else None


def _serving_batch(config: Config) -> tuple[int, str]:
    serve, engine = config.serve, config.speculation.engine
    if config.platform.backend == "torch":
        if engine == "native":
            return serve.max_batch, f"serve.max_batch {serve.max_batch}, our loop on the torch backend"
        return 1, f"engine {engine} serves one request at a time on the torch backend"
    library, compiled = config.neuron.library, config.target.batch_size
    rule = _batching_rule(config)
    if rule is None:
        return 1, f"engine {engine} on {library} serves one request at a time"
    if compiled == 1:
        return 1, f"the target is compiled for batch 1 (target.batch_size) on {library}"
    # a loop that takes its batch at the start: a request that arrives meanwhile waits for the whole batch
    joining = "rows join and leave a running batch" if rule.continuous else "a request joins only between batches"
    if serve.max_batch <= compiled:
        return serve.max_batch, (
            f"serve.max_batch {serve.max_batch} within target.batch_size {compiled}, the batch "
            f"the target is compiled for; engine {engine} on {library} batches, {joining}"
        )
    return compiled, (
        f"target.batch_size {compiled} caps serve.max_batch {serve.max_batch}: the target is compiled "
        f"for batch {compiled}; engine {engine} on {library} batches, {joining}"
    )
