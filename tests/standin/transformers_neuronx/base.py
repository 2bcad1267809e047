"""Stand-in of transformers_neuronx.base.NeuronModelBase: speculation, compile, save/load, to_neuron.

Stricter than the real one where the real one fails late and obscurely: speculative decoders
enabled after `to_neuron()` raise at once, and `load()` of artifacts saved for other constructor
arguments or speculation lengths raises in `to_neuron()`.

The batching preprocessing of the real base.py (1ade6d7) is ported as written, padding rows and all:
`_prepare_for_continuous_batching` (lines 492-587, without paged attention, chunked prefill, EAGLE and
the 1-D query, which need options we never set) and `_postprocess` (lines 613-639).
"""

import bisect
import json
import os

import torch

from transformers_neuronx import _standin
from transformers_neuronx.module import PretrainedModel

ARTIFACT_FILE = "standin-neffs.json"
SMALLEST_TOKEN_BUCKET = 128


def context_buckets(n_positions):
    """bucket.context_sizes(None, token_sizes(n_positions)): half of each power-of-two token bucket from 128,
    the last token bucket being n_positions (bucket.py lines 21-72, utils.py power_of_two_bucket_sizes)."""
    sizes, size = [], SMALLEST_TOKEN_BUCKET
    while size < n_positions:
        sizes.append(size)
        size *= 2
    return [bucket // 2 for bucket in [*sizes, n_positions]]


def find_bucket(buckets, size):
    """bucket.find: the smallest bucket that fits, else the largest."""
    return buckets[bisect.bisect_left(buckets, size, hi=len(buckets) - 1)]


def context_bucket(n_positions, n_active_tokens):
    return find_bucket(context_buckets(n_positions), n_active_tokens)


class NeuronModelBase(PretrainedModel):
    if _standin.API == "sdk_2_18":

        def save(self, directory):
            self._save(directory)

        def enable_speculative_decoder(self, speculation_length: list[int] | int | None):
            self._enable(speculation_length, None)
    else:

        def save(self, directory, sharded_weights=False):
            self._save(directory)

        def enable_speculative_decoder(
            self,
            speculation_length: list[int] | int | None,
            batch_sizes: list[int] | int | None = None,
            token_tree=None,
        ):
            self._enable(speculation_length, batch_sizes)

    if _standin.ONE_K:

        def enable_speculative_decoder(self, speculation_length, batch_sizes=None, token_tree=None):
            if not isinstance(speculation_length, int):
                raise TypeError("this build compiles one speculation_length per model")
            self._enable(speculation_length, batch_sizes)

    def load(self, directory):
        _standin.RUNTIME.record(self.label, "load", directory=str(directory))
        self._compiled_artifacts_directory = directory

    def compile(self, parallel_degree=None):
        _standin.RUNTIME.record(self.label, "compile", parallel_degree=parallel_degree)
        self.compiled = True

    def to_neuron(self):
        _standin.RUNTIME.record(self.label, "to_neuron")
        self.cores = _standin.RUNTIME.claim(self.tp_degree)
        directory = getattr(self, "_compiled_artifacts_directory", None)
        if directory is None and _standin.API == "sdk_2_18":
            self.compile()  # 7a30b42: one neuronx-cc process per network
        elif directory is None:
            self.compile(parallel_degree=self.neuron_config.compilation_worker_count)  # 1ade6d7 base.py line 88
        else:
            self._load_compiled_artifacts(directory)
        self.on_neuron = True

    def reset(self):
        _standin.RUNTIME.record(self.label, "reset")
        self.caches = [[None] * self.n_positions for _ in range(self.cache_rows)]

    def _prepare_for_continuous_batching(self, input_ids, cache_ids=None, seq_ids=None):
        n_seqs, n_active_tokens = input_ids.shape
        continuous_batching = self.neuron_config and self.neuron_config.continuous_batching

        if seq_ids is None or not continuous_batching:
            # static batching
            return input_ids, cache_ids, seq_ids

        batch_size = self.neuron_config.continuous_batching.batch_size_for_shared_caches

        if n_active_tokens > 1 and cache_ids.flatten()[0].item() == 0:
            # context encoding
            n_active_seqs, n_active_tokens = input_ids.shape
            continuous_batching_n_positions = context_bucket(self.n_positions, n_active_tokens)
            assert n_active_seqs == cache_ids.shape[0], (
                f"invalid n_active_seqs ({n_active_seqs} vs {cache_ids.shape[0]})"
            )
            assert n_active_tokens <= continuous_batching_n_positions, (
                f"invalid input prompt length ({n_active_tokens} <= {continuous_batching_n_positions})"
            )
            cache_ids_pad = torch.zeros(n_active_seqs, continuous_batching_n_positions, dtype=cache_ids.dtype)
            for seq_id in range(n_active_seqs):
                cache_ids_pad[seq_id, :n_active_tokens] = cache_ids[seq_id, :n_active_tokens]
            return input_ids, cache_ids_pad, seq_ids

        elif n_active_tokens > 1 and cache_ids.flatten()[0].item() > 0:
            # speculative forward
            n_active_seqs, n_active_tokens = input_ids.shape
            prompt_buckets = sorted({k for k, batch_size in self.speculation_decoders})
            speculation_bucket = find_bucket(prompt_buckets, n_active_tokens)
            # validate the speculative head was compiled for the given batch size
            speculation_batches = [batch_size for (k, batch_size) in self.speculation_decoders]
            assert n_active_seqs in speculation_batches, (
                f"invalid batch size for speculative forward ({n_active_seqs} not in {speculation_batches})"
            )
            if len(cache_ids.shape) == 1:
                cache_ids = cache_ids.unsqueeze(0)
            assert cache_ids.shape[0] == n_active_seqs, (
                f"invalid n_active_seqs ({n_active_seqs} vs {cache_ids.shape[0]}) in speculative forward"
            )
            # pad cache IDs with max(n_positions) - 1
            cache_ids_pad = torch.full(
                (n_active_seqs, speculation_bucket), max(context_buckets(self.n_positions)) - 1, dtype=cache_ids.dtype
            )
            for seq_id in range(n_active_seqs):
                cache_ids_pad[seq_id, :n_active_tokens] = cache_ids[seq_id, :n_active_tokens]
            return input_ids, cache_ids_pad, seq_ids

        # token generation - padding for naive continuous batching
        full_input_ids = torch.zeros(batch_size, 1, dtype=input_ids.dtype)
        full_cache_ids = torch.zeros(batch_size, 1, dtype=input_ids.dtype)
        full_seq_ids = torch.arange(batch_size, dtype=torch.int32)
        seq_ids_int64 = seq_ids.flatten().unsqueeze(-1).to(torch.int64)
        full_input_ids.scatter_(dim=0, index=seq_ids_int64, src=input_ids)
        full_cache_ids.scatter_(dim=0, index=seq_ids_int64, src=cache_ids)
        return full_input_ids, full_cache_ids, full_seq_ids

    def _postprocess(self, input_ids, logits, start_ids=None):
        if start_ids is None:
            return logits
        if not self.neuron_config.lhs_aligned or input_ids.shape[-1] > 1:
            return logits
        input_batch_size = start_ids.shape[0]
        seq_ids = start_ids.flatten()
        if torch.equal(seq_ids, torch.arange(input_batch_size)):
            logits = logits[:input_batch_size]
        else:
            logits = logits[seq_ids.to(torch.long)]
        return logits

    # ------------------------------------------------------------------ stand-in internals

    def _enable(self, speculation_length, batch_sizes):
        lengths = [speculation_length] if isinstance(speculation_length, int) else list(speculation_length)
        sizes = (
            [self.batch_size]
            if batch_sizes is None
            else ([batch_sizes] if isinstance(batch_sizes, int) else list(batch_sizes))
        )
        _standin.RUNTIME.record(
            self.label,
            "enable_speculative_decoder",
            speculation_length=speculation_length,
            batch_sizes=batch_sizes,
        )
        if getattr(self, "on_neuron", False):
            raise RuntimeError(
                "enable_speculative_decoder() after to_neuron(): that decoder is never compiled; "
                "call it before to_neuron()"
            )
        for k in lengths:
            for size in sizes:
                self.speculation_decoders.add((k, size))

    def _artifact_identity(self):
        return {
            "n_positions": self.n_positions,
            "batch_size": self.batch_size,
            "amp": self.amp,
            "tp_degree": self.tp_degree,
            "speculation": sorted(self.speculation_decoders),
        }

    def _save(self, directory):
        _standin.RUNTIME.record(self.label, "save", directory=str(directory))
        if not getattr(self, "compiled", False):
            raise RuntimeError("save() before the model was compiled (to_neuron()): there are no NEFFs to save")
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, ARTIFACT_FILE), "w") as f:
            json.dump(self._artifact_identity(), f)

    def _load_compiled_artifacts(self, directory):
        path = os.path.join(directory, ARTIFACT_FILE)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"Did not find compiled artifacts in {directory}")
        with open(path) as f:
            saved = json.load(f)
        wanted = json.loads(json.dumps(self._artifact_identity()))
        if saved != wanted:
            raise RuntimeError(f"compiled artifacts in {directory} were built for {saved}, this model is {wanted}")
        _standin.RUNTIME.record(self.label, "load_compiled_artifacts", directory=str(directory))
        self.compiled = True
