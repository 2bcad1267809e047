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
  told about: wall time, tokens/s and the acceptance counts include that work.

Batch > 1 (`sample(input_ids, start_ids, attention_mask, sequence_length)`, fused_speculation.py:504-742): the
prompts are padded on the RIGHT and `attention_mask` marks the real tokens (asserted for batch > 1, :555-558);
context `cache_ids = arange(len) * mask` (:559), each row's first new token at its count of ones (:598-601);
`start_ids` are the sequence ids arange(bs) (:552-553). Both models must be built with
NeuronConfig(padding_side='right') (asserted, :318-325); then the graph keeps 2-D cache_ids, each row drafting
and scoring from its own position (:200-202). One `sequence_length` for all rows (the longest budget; shorter
rows are cut here); a row stops at the one EOS id (:685-710) or at sequence_length (:730-732). Sampling is per
row on the device, with the settings compiled in (one GenerationConfig for the whole batch, unseeded): the
pipeline refuses per-request settings that differ (pipeline/build.py `refuse_unhonoured`).
Statistics: `rate[row]` would count row 0's tokens for every row (`rate[batch][counts[0][0]]`, :683), so each
iteration's per-row counts are read where the loop reads them, from its `speculator.execute(...)` (:677: tokens,
counts): every iteration drafts fused_k tokens and commits counts[row], so acceptance rate, mean accepted length
and per-position acceptance are exact per row; the draft / target time split is not observable (one graph), and
is reported as zero.
"""

from __future__ import annotations

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
from neuron_ssp.engines.rows import Row, RowRequest
from neuron_ssp.engines.static_batch import (
    CallTimes,
    Piece,
    RowOutput,
    StaticBatchLoop,
    context_buckets,
    pad_id,
    padded_batch,
    require_one_context,
    require_right_padding,
)
from neuron_ssp.speculation.sampling import SamplingParams
from neuron_ssp.topology.positions import extra_target_slots

HISTOGRAM_COLUMNS = 10  # `rate = torch.zeros(batch_size, 10)` in FusedSpeculativeDecoder.sample (1ade6d74)
MAX_WINDOW = HISTOGRAM_COLUMNS - 1  # our k = fused k + 1 = the most tokens one iteration commits


def fused_k(window: int) -> int:
    """Our window k (k-1 drafted, k scored) -> FusedSpeculativeDecoder's k (tokens the draft speculates)."""
    return window - 1


class FusedEngine:
    """Same `generate` as `SpeculativeGenerator`, run by `FusedSpeculativeDecoder.sample`; `row_loop()` runs it
    over as many requests at once as the models were compiled for (`target.batch_size`)."""

    def __init__(self, decoder: Any, target: OnDeviceBackend, k: int, batch_size: int = 1):
        self.decoder = decoder
        self.target = target
        self.k = k
        self.batch_size = batch_size
        self.vocab_size = target.vocab_size

    @classmethod
    def build(cls, config: Config, target: OnDeviceBackend, draft: OnDeviceBackend) -> FusedEngine:
        fused, _ = load_fused_modules()
        batch_size = config.target.batch_size  # one the installed build's decoder takes: its loader checked
        if batch_size > 1:
            require_right_padding({"target": target.model, "draft": draft.model})
        warn_about_device_sampling(config.sampling)
        model_dir = resolve_model_path(config.target.path, "target.path")
        stop = stop_id(model_dir, config.generation.chat_template)
        decoder = fused.FusedSpeculativeDecoder(
            draft.model,
            target.model,
            k=fused_k(config.speculation.k),
            pad_token_id=pad_id(target.model, stop),
            eos_token_id=stop,
        )
        decoder.to_neuron(workers=compile_estimate(config).bound)  # its fused graphs compile now
        return cls(decoder, target, config.speculation.k, batch_size)

    def row_loop(self) -> StaticBatchLoop:
        """Requests as rows of one `sample` call each (`RowLoop`): up to `batch_size` join, one call runs them all."""
        return StaticBatchLoop(self)

    def generate(
        self,
        prompt_ids: torch.Tensor,
        max_new_tokens: int,
        eos_token_ids: Collection[int] = (),
        on_tokens: TokenCallback | None = None,
    ) -> GenerationResult:
        """One request: the row loop with one row (padded to the compiled batch)."""
        request = RowRequest(
            prompt_ids, max_new_tokens, SamplingParams(), eos_token_ids=eos_token_ids, on_tokens=on_tokens
        )  # the device samples with the settings it was compiled with
        return self.row_loop().run(request)

    # ------------------------------------------------------------------ LibraryCall (engines/static_batch.py)

    def check(self, request: RowRequest) -> None:
        # sample() asserts sequence_length <= max_position - its k: P+N+k-1 slots (topology.positions)
        check_room(
            self.target,
            request.prompt_ids.shape[0],
            request.max_new_tokens,
            "target.n_positions",
            extra_target_slots("fused", self.k),
        )
        if self.batch_size > 1:
            require_one_context(request.prompt_ids.shape[0], min(max(buckets) for buckets in self.buckets))

    @property
    def buckets(self) -> tuple[list[int], list[int]]:
        """The target's and the draft's context buckets (both encode the prompts, fused_speculation.py:576, :592):
        a batch's prompts fit the smallest of their largest."""
        draft = self.decoder.draft
        return (
            context_buckets(self.target.model, self.target.n_positions),
            context_buckets(draft, getattr(draft, "n_positions", self.target.n_positions)),
        )

    def generate_rows(self, rows: list[Row], times: CallTimes) -> list[RowOutput]:
        """One `FusedSpeculativeDecoder.sample` over `rows`, padded to the compiled batch."""
        batch = padded_batch(rows, self.batch_size, self.decoder.pad_token_id)
        speculator = self.decoder.speculator
        counted = _CountedIterations(speculator, self.batch_size, fused_k(self.k))
        self.decoder.speculator = counted
        try:
            if self.batch_size == 1:  # as before batching existed
                sequences, _, _ = self.decoder.sample(batch.input_ids, sequence_length=batch.sequence_length)
            else:  # fused_speculation.py:551-560: right-padded prompts, their mask, sequence ids
                sequences, _, _ = self.decoder.sample(
                    batch.input_ids,
                    start_ids=batch.start_ids,
                    attention_mask=batch.attention_mask,
                    sequence_length=batch.sequence_length,
                )
        finally:
            self.decoder.speculator = speculator
        return [
            RowOutput(
                sequences[i, batch.prompt_lens[i] : batch.prompt_lens[i] + row.seq.max_new_tokens].tolist(),
                counted.pieces[i],
            )
            for i, row in enumerate(rows)
        ]


class _CountedIterations:
    """The decoder's compiled program, recording what each iteration commits per row (tokens, counts: the first
    two outputs of `speculator.execute`, fused_speculation.py:677)."""

    def __init__(self, inner: Any, batch_size: int, drafted: int):
        self._inner = inner
        self._drafted = drafted
        self.pieces: list[list[Piece]] = [[] for _ in range(batch_size)]

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        outputs = self._inner.execute(*args, **kwargs)
        tokens, counts = outputs[0], outputs[1]
        for row, pieces in enumerate(self.pieces):
            count = int(counts[row][0])
            pieces.append(Piece(tokens[row, :count].tolist(), count - 1, self._drafted))
        return outputs

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def warn_about_device_sampling(sampling: SamplingConfig) -> None:
    """What the on-device sampler makes of our settings (docs/neuron.md, engine fused)."""
    notes = []
    if sampling.temperature > 0:
        notes.append(
            "sampling.seed has no effect: the device draws from its own unseeded Rng "
            "(hlo.py random_uniform), so the same prompt may give another text"
        )
    if sampling.temperature > 0 and not sampling.top_k:
        notes.append(
            "top_k 0 becomes a top-k over the whole vocabulary at every position (lossless, but slower "
            "than a small top_k)"
        )
    if notes:
        warnings.warn("engine fused samples on device: " + "; ".join(notes), stacklevel=3)
