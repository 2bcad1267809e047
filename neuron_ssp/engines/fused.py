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

Batch 1 runs `sample` (fused_speculation.py:504-742), as before batching existed. Statistics: `rate[row]` would
count row 0's tokens for every row (`rate[batch][counts[0][0]]`, :683), so each iteration's counts are read where
the loop reads them, from its `speculator.execute(...)` (:677: tokens, counts): every iteration drafts fused_k
tokens and commits counts[row], so acceptance rate, mean accepted length and per-position acceptance are exact;
the draft / target time split is not observable (one graph), and is reported as zero.

Batch B > 1 is continuous batching through the decoder's own entry for it, `speculative_iteration` (:746-867), as
vLLM's transformers-neuronx worker drives it (`NeuronSpeculationCausalLM.forward`, vllm 9f77d7f7
model_executor/model_loader/neuron.py, both models built with `ContinuousBatchingConfig`, on-device embedding and
generation): a call whose cache ids start at 0 is a prompt, context-encoded by target and draft into the cache line
its start id names (:776-811; at batch 1 per prompt under continuous batching, llama/model.py:83-84); any other
call is one iteration of the fused graph for the rows given, padded to the compiled batch with the missing
sequence ids (token 0 at cache id 0, :826-831, :871-894, so a free line costs nothing: the graph's bucket follows
the largest cache id, program.py:451-452), and returns each row's tokens and count (:862-867). The fused graph
advances every row from its own position (:173-202), so rows join between iterations (engines/fused_rows.py) and
each commits its own count; nothing here meets SpeculativeGenerator's int32 draft step (speculation.py:356),
which is what keeps `engine: library` from continuous batching. Two things the source does are worked around:
- `speculative_iteration_post_process` (:220-234) rewrites every token equal to pad_token_id into row 0's first
  token before it cuts the rows at their counts: with the EOS as pad, a row's EOS would become another token. The
  decoder is built with pad_token_id = the vocabulary size, which no row produces;
- a one-token prompt would take the one-token branch of continuous batching, which writes token 0 at cache id 0 of
  every other sequence (base.py:575-587): it is encoded in a full-batch call instead, every running row at its
  next position (stale: the next iteration writes it before reading it).
A prompt must fit one context network (the library asserts it, base.py:508). Sampling is per row on the device,
with the settings compiled in (one GenerationConfig for the whole batch, unseeded): the pipeline refuses
per-request settings that differ (pipeline/build.py `refuse_unhonoured`).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from neuron_ssp.backends.checkpoint import stop_id
from neuron_ssp.backends.neuron.load import fused_decoder
from neuron_ssp.backends.neuron.on_device import OnDeviceBackend
from neuron_ssp.config import Config, SamplingConfig
from neuron_ssp.engines.base import check_room
from neuron_ssp.engines.fused_rows import FusedRowLoop
from neuron_ssp.engines.rows import Row, RowLoop, RowRequest, RowSettings
from neuron_ssp.engines.static_batch import (
    CallTimes,
    IterationPiece,
    RowOutput,
    StaticBatchEngine,
    pad_id,
    padded_batch,
    require_one_context,
)
from neuron_ssp.errors import Problem, RuntimeProblem
from neuron_ssp.speculation.sampling import SamplingParams
from neuron_ssp.topology.networks import shared_context
from neuron_ssp.topology.positions import extra_target_slots

HISTOGRAM_COLUMNS = 10  # `rate = torch.zeros(batch_size, 10)` in FusedSpeculativeDecoder.sample (1ade6d74)
MAX_WINDOW = HISTOGRAM_COLUMNS - 1  # our k = fused k + 1 = the most tokens one iteration commits


def fused_k(window: int) -> int:
    """Our window k (k-1 drafted, k scored) -> FusedSpeculativeDecoder's k (tokens the draft speculates)."""
    return window - 1


class FusedEngine(StaticBatchEngine):
    """`FusedSpeculativeDecoder` as an engine: `row_loop()` runs one `sample` call per request at batch 1, and the
    rows of one continuous batch at `target.batch_size` > 1 (`FusedDecoderLoop`)."""

    engine = "fused"  # sample() asserts sequence_length <= max_position - its k: P+N+k-1 slots

    def __init__(self, decoder: Any, target: OnDeviceBackend, k: int, batch_size: int = 1):
        super().__init__(target, k, batch_size)
        self.decoder = decoder
        self.loop = FusedDecoderLoop(decoder, target, k) if batch_size > 1 else None

    @classmethod
    def build(cls, config: Config, target: OnDeviceBackend, draft: OnDeviceBackend) -> FusedEngine:
        batch_size = config.target.batch_size  # one the installed build's decoder takes: its loader checked
        if batch_size > 1:
            require_continuous_batching({"target": target.model, "draft": draft.model})
        warn_about_device_sampling(config.sampling)
        assert target.model_dir is not None, "the target comes from the loader, which knows its checkpoint"
        stop = stop_id(target.model_dir, config.generation.chat_template)
        pad = pad_id(target.model, stop) if batch_size == 1 else target.vocab_size  # module docstring
        decoder = fused_decoder(config, target, draft, fused_k(config.speculation.k), pad, stop)
        return cls(decoder, target, config.speculation.k, batch_size)

    def row_loop(self) -> RowLoop:
        """At batch > 1 the decoder's one loop (it owns the cache lines, so every caller shares it); at batch 1 one
        `sample` call per request."""
        return self.loop if self.loop is not None else super().row_loop()

    def row_settings(self) -> RowSettings:
        return RowSettings(SamplingParams())  # the device samples with the settings it was compiled with

    def generate_rows(self, rows: list[Row], times: CallTimes) -> list[RowOutput]:
        """One `FusedSpeculativeDecoder.sample` over the one row of batch 1."""
        batch = padded_batch(rows, self.batch_size, self.decoder.pad_token_id)
        speculator = self.decoder.speculator
        counted = _CountedIterations(speculator, self.batch_size, fused_k(self.k))
        self.decoder.speculator = counted
        try:
            sequences, _, _ = self.decoder.sample(batch.input_ids, sequence_length=batch.sequence_length)
        finally:
            self.decoder.speculator = speculator
        return [
            RowOutput(
                sequences[i, batch.prompt_lens[i] : batch.prompt_lens[i] + row.seq.max_new_tokens].tolist(),
                counted.pieces[i],
            )
            for i, row in enumerate(rows)
        ]


class FusedDecoderLoop(FusedRowLoop):
    """Rows of one continuous batch of `FusedSpeculativeDecoder` (engines/fused_rows.py), each call through
    `speculative_iteration` (module docstring)."""

    library = "transformers-neuronx"

    def __init__(self, decoder: Any, target: OnDeviceBackend, k: int):
        super().__init__(target, k, decoder.batch_sizes[0])
        self.decoder = decoder

    def check(self, request: RowRequest) -> None:
        prompt_len = request.prompt_ids.shape[0]
        check_room(
            self.target, prompt_len, request.max_new_tokens, "target.n_positions", extra_target_slots("fused", self.k)
        )
        n_positions = self.target.n_positions  # the draft's is at least the target's (topology.positions)
        require_one_context(
            prompt_len,
            shared_context([(self.decoder.target, n_positions), (self.decoder.draft, n_positions)]),
            "a longer one fails its continuous-batching context encoding (base.py:508 at 1ade6d7), and a fused "
            "iteration takes one token per row",
        )

    def first_token(self, row: Row) -> int:
        prompt = row.request.prompt_ids
        if prompt.shape[0] == 1:
            return self._one_token_prompt(row)
        token, _ = self.decoder.speculative_iteration(
            prompt.view(1, -1), torch.arange(prompt.shape[0]).view(1, -1), torch.tensor([row.slot])
        )
        return int(token.reshape(-1)[0])

    def accepted(self, rows: list[Row]) -> list[list[int]]:
        tokens, counts = self.decoder.speculative_iteration(
            torch.tensor([[row.seq.last] for row in rows]),
            torch.tensor([[row.seq.length - 1] for row in rows]),  # each row's last committed token, in no cache yet
            torch.tensor([row.slot for row in rows]),
        )
        return [tokens[i, : int(counts[i])].tolist() for i in range(len(rows))]

    def _one_token_prompt(self, row: Row) -> int:
        """Target and draft over every cache line at once: the new row's token at 0, every running row a pad token
        at its next position, the free lines at 0 (module docstring)."""
        input_ids = torch.zeros(self.slots, 1, dtype=torch.int64)
        cache_ids = torch.zeros(self.slots, 1, dtype=torch.int64)
        for running in self.rows:
            cache_ids[running.slot] = running.seq.length - 1
        input_ids[row.slot] = row.request.prompt_ids[0]
        seq_ids = torch.arange(self.slots, dtype=torch.int32)
        tokens = self.decoder.target(input_ids, cache_ids=cache_ids, start_ids=seq_ids)
        self.decoder.draft(input_ids, cache_ids=cache_ids, start_ids=seq_ids)
        return int(tokens.reshape(self.slots, -1)[row.slot, 0])


class _CountedIterations:
    """The decoder's compiled program, recording what each iteration commits per row (tokens, counts: the first
    two outputs of `speculator.execute`, fused_speculation.py:677)."""

    def __init__(self, inner: Any, batch_size: int, drafted: int):
        self._inner = inner
        self._drafted = drafted
        self.pieces: list[list[IterationPiece]] = [[] for _ in range(batch_size)]

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        outputs = self._inner.execute(*args, **kwargs)
        tokens, counts = outputs[0], outputs[1]
        for row, pieces in enumerate(self.pieces):
            count = int(counts[row][0])
            pieces.append(IterationPiece(tokens[row, :count].tolist(), count - 1, self._drafted))
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


def require_continuous_batching(models: dict[str, Any]) -> None:
    """Batch > 1 runs rows that join and leave: both models built with NeuronConfig(continuous_batching=...), one KV
    cache line per sequence that start ids address (what load_on_device_backends builds)."""
    missing = [
        role
        for role, model in models.items()
        if getattr(getattr(model, "neuron_config", None), "continuous_batching", None) is None
    ]
    if missing:
        raise RuntimeProblem(
            Problem(
                "target.batch_size",
                "> 1",
                f"the {' and '.join(missing)} model was built without NeuronConfig(continuous_batching=...), which "
                "engine fused at batch > 1 needs (its rows join and leave through speculative_iteration)",
                "load the models through neuron-ssp with the batch in the config (it sets continuous batching), or set "
                "target.batch_size: 1",
            )
        )
