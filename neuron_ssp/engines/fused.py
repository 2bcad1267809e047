"""`speculation.engine: fused`: transformers-neuronx's `FusedSpeculativeDecoder`, the draft loop on device.

Our native loop makes one host round trip per draft token; the fused decoder (fused_speculation.py at
1ade6d74, SDK 2.21+) compiles draft steps, target window and token selection into one graph. What the
source says, and how it maps onto this package:
- its `k` is "the number of tokens to speculate with the draft model": the graph runs the draft k + 1
  times and the target over k + 1 positions (`n_active_tokens = self.k + 1`). Our window k scores k
  positions per call with k-1 drafted tokens, so we pass `k=speculation.k - 1` (`fused_k`);
- both models need `NeuronConfig(on_device_embedding=True, on_device_generation=GenerationConfig(...))`
  (config.py), given to `from_pretrained(..., neuron_config=...)`; then they return token ids, not
  logits, so plain decoding and the self-test cannot run on them;
- sampling happens on device with the GenerationConfig's temperature / top_k / top_p; acceptance is
  the library's (greedy when `do_sample=False`, rejection sampling otherwise): no plug-in acceptor,
  no adaptive window, no model-free drafter;
- same tp and vocabulary for both models; `sequence_length <= max_position - k`; `sample` counts
  committed tokens per iteration in a (batch, 10) histogram (`rate`), so k + 1 <= 9;
- `eos_token_id` is one id (its host loop compares each token with it, l.628-699); the on-device
  GenerationConfig takes the full list. We give the loop the id the chat actually ends with (Llama-3:
  <|eot_id|> 128009, not the tokenizer's 128001; `checkpoint.stop_id`), cut the output at any EOS on
  the host, and count in `stats.tokens_after_eos` what the device generated past an EOS it was not
  told about: wall time, tokens/s and the `rate` histogram include that work.
Acceptance stats come from that histogram: every iteration drafts fused_k tokens and commits n, so
acceptance rate, mean accepted length and per-position acceptance are exact; the draft / target time
split is not observable (one graph), and is reported as zero.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Collection
from typing import Any

import torch

from neuron_ssp.backends.checkpoint import stop_id
from neuron_ssp.backends.neuron.load import compile_estimate
from neuron_ssp.backends.neuron.on_device import OnDeviceBackend, load_fused_modules
from neuron_ssp.config import Config, SamplingConfig
from neuron_ssp.embedded.models import resolve_model_path
from neuron_ssp.engines.base import GenerationResult, TokenCallback, check_room
from neuron_ssp.speculation.stats import GenerationStats
from neuron_ssp.topology.positions import extra_target_slots

HISTOGRAM_COLUMNS = 10  # `rate = torch.zeros(batch_size, 10)` in FusedSpeculativeDecoder.sample (1ade6d74)
MAX_WINDOW = HISTOGRAM_COLUMNS - 1  # our k = fused k + 1 = the most tokens one iteration commits


def fused_k(window: int) -> int:
    """Our window k (k-1 drafted, k scored) -> FusedSpeculativeDecoder's k (tokens the draft speculates)."""
    return window - 1


class FusedEngine:
    """Same `generate` as `SpeculativeGenerator`, run by `FusedSpeculativeDecoder.sample`."""

    def __init__(self, decoder: Any, target: OnDeviceBackend, k: int):
        self.decoder = decoder
        self.target = target
        self.k = k

    @classmethod
    def build(cls, config: Config, target: OnDeviceBackend, draft: OnDeviceBackend) -> FusedEngine:
        fused, _ = load_fused_modules()
        warn_about_device_sampling(config.sampling)
        model_dir = resolve_model_path(config.target.path, "target.path")
        stop = stop_id(model_dir, config.generation.chat_template)
        decoder = fused.FusedSpeculativeDecoder(
            draft.model,
            target.model,
            k=fused_k(config.speculation.k),
            pad_token_id=_pad_id(target.model, stop),
            eos_token_id=stop,
        )
        decoder.to_neuron(workers=compile_estimate(config).bound)  # its fused graphs compile now
        return cls(decoder, target, config.speculation.k)

    def generate(
        self,
        prompt_ids: torch.Tensor,
        max_new_tokens: int,
        eos_token_ids: Collection[int] = (),
        on_tokens: TokenCallback | None = None,
    ) -> GenerationResult:
        prompt_len = prompt_ids.shape[0]
        # sample() asserts sequence_length <= max_position - its k: P+N+k-1 slots (topology.positions)
        check_room(self.target, prompt_len, max_new_tokens, "target.n_positions", extra_target_slots("fused", self.k))
        stats = GenerationStats(k=self.k)
        start = time.perf_counter()
        sequences, rate, _ = self.decoder.sample(prompt_ids.view(1, -1), sequence_length=prompt_len + max_new_tokens)
        stats.wall_s = time.perf_counter() - start
        generated = sequences[0, prompt_len : prompt_len + max_new_tokens].tolist()
        tokens = _cut_at_eos(generated, set(eos_token_ids))
        record_histogram(stats, rate[0], fused_k(self.k))
        stats.new_tokens = len(tokens)
        stats.tokens_after_eos = len(generated) - len(tokens)
        if on_tokens and tokens:
            on_tokens(tokens)
        return GenerationResult(tokens, stats)


def warn_about_device_sampling(sampling: SamplingConfig) -> None:
    """What the on-device sampler makes of our settings (docs/neuron.md, engine fused)."""
    notes = []
    if sampling.temperature > 0:
        notes.append("sampling.seed has no effect: the device draws from its own unseeded Rng "
                     "(hlo.py random_uniform), so the same prompt may give another text")
    if sampling.temperature > 0 and not sampling.top_k:
        notes.append("top_k 0 becomes a top-k over the whole vocabulary at every position (lossless, but slower "
                     "than a small top_k)")
    if notes:
        warnings.warn("engine fused samples on device: " + "; ".join(notes), stacklevel=3)


def record_histogram(stats: GenerationStats, rate: torch.Tensor, drafted: int) -> None:
    """`rate[n]` iterations committed n tokens (n-1 accepted drafts + 1 from the target) of `drafted` proposed."""
    for committed in range(1, min(len(rate), drafted + 2)):
        for _ in range(int(rate[committed])):
            stats.record_call(drafted, committed - 1, committed)


def _pad_id(model: Any, stop: int | None) -> int:
    pad = getattr(getattr(model, "config", None), "pad_token_id", None)
    return pad if isinstance(pad, int) else (stop if stop is not None else 0)


def _cut_at_eos(tokens: list[int], eos: set[int]) -> list[int]:
    for i, token in enumerate(tokens):
        if token in eos:
            return tokens[: i + 1]
    return tokens
