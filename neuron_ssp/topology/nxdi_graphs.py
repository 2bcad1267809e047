"""The graphs NxD Inference compiles for one model: a context-encoding graph per prompt bucket and a decoding
graph per cache bucket. Pure arithmetic, shared by the NeuronConfig we build (backends/nxdi/api.py), `plan`
and `compile`, so the count they print is the count NxDI compiles.

At 4bcdc54b (0.9.0) each sub-model's ModelWrapper traces one graph per entry of its `buckets`
(application_base.py:272-288), set in model_base.py:3090-3164 from modules/autobucketing.py:
- context encoding: without `enable_bucketing` one bucket, max_context_length, so every prefill is padded to
  it (model_wrapper.py:756-790: a 100-token prompt pays for 2,048); with it, `context_encoding_buckets` or
  `generate_buckets(128, max_context_length)`. A prompt runs the first bucket longer than it
  (`_get_seq_bucket`, model_wrapper.py:903; the largest also takes a prompt of exactly its length).
- decoding (token generation, speculation, fused speculation): `token_generation_buckets`, else with
  bucketing `generate_buckets(128, max_length)`. We pass [n_positions] unless the config lists buckets:
  one decoding graph per model (a target per k) as before, where a batch-1 step reads the weights anyway.
- fused speculation (`enable_fused_speculation`): the draft is compiled inside the target's graphs.
"""

from __future__ import annotations

from math import log2

from neuron_ssp.config import Config, ModelConfig
from neuron_ssp.topology.networks import Networks

SMALLEST_CONTEXT_BUCKET = 128  # generate_buckets_for_cte: generate_buckets(128, max_context_length)


def default_buckets(smallest: int, largest: int) -> list[int]:
    """NxDI's `autobucketing.generate_buckets`: powers of two from `smallest` below 2**round(log2(largest)),
    then `largest` (rounding, not flooring, the log keeps a bucket from sitting just below the largest)."""
    if smallest == largest:
        return [largest]
    return [2**i for i in range(int(log2(smallest)), round(log2(largest)))] + [largest]


def max_context_length(config: Config, model: ModelConfig) -> int:
    """The longest prompt a model is compiled for: generation.max_prompt_tokens, at most its n_positions."""
    return min(config.generation.max_prompt_tokens or model.n_positions, model.n_positions)


def nxdi_context_buckets(config: Config, model: ModelConfig) -> list[int]:
    """The prompt lengths NxDI compiles a context-encoding graph for: the config's, else NxDI's default."""
    given = config.neuron.nxdi.context_encoding_buckets
    return list(given) if given else default_buckets(SMALLEST_CONTEXT_BUCKET, max_context_length(config, model))


def nxdi_token_buckets(config: Config, model: ModelConfig) -> list[int]:
    """The cache lengths NxDI compiles a decoding graph for: the config's, else n_positions alone."""
    given = config.neuron.nxdi.token_generation_buckets
    return list(given) if given else [model.n_positions]


def context_batch(config: Config, model: ModelConfig) -> int:
    """Rows of a context-encoding graph: 1 where fused speculation batches continuously (is_continuous_batching with
    ctx_batch_size 1: a prefill writes one seq_id, kv_cache_manager.py:483-484), else the model's batch."""
    fused = config.speculation.engine == "fused"
    return 1 if fused and model.batch_size > 1 else model.batch_size


def nxdi_graphs(config: Config, role: str, model: ModelConfig) -> Networks:
    """Graphs NxDI compiles for `role` at one k: context buckets + decoding buckets (the target's decoding graph
    is its k-wide speculation model, the draft's a one-token one); a fused draft has none of its own. Decoding
    graphs are traced at tkg_batch_size (model_base.py:3078-3084), context graphs at ctx_batch_size (:3107-3113)."""
    if role == "draft" and config.speculation.engine == "fused":
        return Networks(0, 0, 0)
    context, decoding = len(nxdi_context_buckets(config, model)), len(nxdi_token_buckets(config, model))
    batches = {"batch": model.batch_size, "context_batch": context_batch(config, model)}
    if role == "target":
        return Networks(token=0, context=context, speculation=decoding, **batches)
    return Networks(token=decoding, context=context, speculation=0, **batches)
