"""The networks transformers-neuronx compiles for one model, from its bucket rules. Pure arithmetic.

A `LlamaForSampling` is fully unrolled by default (`unroll` = its layers, llama/model.py), so its
decoders compile one network per (bucket, batch size) (decoder.py `_build_program`): one
token-generation network per token bucket, one context-encoding network per context bucket, and for
each k given to `enable_speculative_decoder` one k-token network per token bucket (base.py line 86 at
0623de2, line 132 at 1ade6d7: `init_speculative_decoder(..., buckets=self.token_buckets, ...)`).

Buckets (bucket.py lines 21-72 and utils.py `power_of_two_bucket_sizes`, the same at 7a30b42, 0623de2
and 1ade6d7; we never pass `context_length_estimate`): token buckets double from 128 and always end at
n_positions; context buckets are half of each. So n_positions 2048 gives token buckets 128..2048 (5)
and context buckets 64..1024 (5), and `compile --k 2..8` adds 7 x 5 = 35 speculation networks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

SMALLEST_TOKEN_BUCKET = 128  # bucket.token_sizes: utils.power_of_two_bucket_sizes(128, n_positions)


def token_buckets(n_positions: int) -> list[int]:
    """Powers of two from 128 below n_positions, then n_positions itself."""
    sizes, size = [], SMALLEST_TOKEN_BUCKET
    while size < n_positions:
        sizes.append(size)
        size *= 2
    return [*sizes, n_positions]


def context_buckets(n_positions: int) -> list[int]:
    """bucket.context_sizes(None, token_buckets): half of each token bucket."""
    return [size // 2 for size in token_buckets(n_positions)]


def model_context_buckets(model: object, n_positions: int) -> list[int]:
    """A loaded model's context buckets: its own `context_buckets` (llama/model.py:69-70 at 1ade6d7), else those of a
    model built without context_length_estimate, as we build them (`context_buckets`)."""
    own = getattr(model, "context_buckets", None)
    return sorted(own) if isinstance(own, list) and own else context_buckets(n_positions)


def shared_context(models: list[tuple[object, int]]) -> int:
    """The longest prompt each of the loaded `models` (with its n_positions) encodes in one context network: the
    smallest of their largest context buckets."""
    return min(max(model_context_buckets(model, n_positions)) for model, n_positions in models)


@dataclass(frozen=True)
class Networks:
    """Compiled networks of one model: one per (batch size, bucket, k), each one neuronx-cc run and one NEFF per
    core. A model is compiled for one batch size (ModelConfig.batch_size; NxDI refuses more than one with
    speculation, batch_rules), so the counts are those of batch 1, each network shaped for `batch` rows."""

    token: int
    context: int
    speculation: int  # k-token networks of every k given to enable_speculative_decoder
    batch: int = 1  # rows of the token-generation and speculation networks
    context_batch: int = 1  # rows of a context-encoding network

    @property
    def total(self) -> int:
        return self.token + self.context + self.speculation


def compiled_networks(
    n_positions: int, windows: Sequence[int] = (), batch: int = 1, continuous: bool = False
) -> Networks:
    """The networks of a model compiled for `n_positions`, `batch` rows and speculation windows `windows` (none: a
    draft). Decoder programs are built per (bucket, batch size) (decoder.py:608 and :619 at 1ade6d7); the context
    networks take the same batch sizes, or batch 1 with continuous batching (llama/model.py:82-84), which our loop
    (engine native) compiles at batch > 1 so that a request joins with a prefill of its own row."""
    tokens = len(token_buckets(n_positions))
    return Networks(
        tokens, len(context_buckets(n_positions)), tokens * len(set(windows)), batch, 1 if continuous else batch
    )
