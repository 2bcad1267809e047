"""Stand-in of transformers_neuronx.base.NeuronModelBase: speculation, compile, save/load, to_neuron.

Stricter than the real one where the real one fails late and obscurely: speculative decoders
enabled after `to_neuron()` raise at once, and `load()` of artifacts saved for other constructor
arguments or speculation lengths raises in `to_neuron()`.

The host-side preprocessing (`_preprocess`, `_prepare_for_continuous_batching`, `_prepare_for_par_ctx_rhs_padding`,
`_pad_cache_ids`, `_postprocess`) is the imitated commit's own, ported in `_preprocessing.py` and mixed in here, so
the cache ids a call reaches the "device" with are the ones that commit sends.
"""

import json
import os

from transformers_neuronx import _standin
from transformers_neuronx._preprocessing import PREPROCESSING, find
from transformers_neuronx.module import PretrainedModel

ARTIFACT_FILE = "standin-neffs.json"
SMALLEST_TOKEN_BUCKET = 128


def token_buckets(n_positions):
    """bucket.token_sizes(n_positions): powers of two from 128 below n_positions, then n_positions (bucket.py:21-40,
    utils.py power_of_two_bucket_sizes; the same at every imitated commit)."""
    sizes, size = [], SMALLEST_TOKEN_BUCKET
    while size < n_positions:
        sizes.append(size)
        size *= 2
    return [*sizes, n_positions]


def context_buckets(n_positions):
    """bucket.context_sizes(None, token_sizes(n_positions)): half of each token bucket (bucket.py:43-72)."""
    return [bucket // 2 for bucket in token_buckets(n_positions)]


def context_bucket(n_positions, n_active_tokens):
    return find(context_buckets(n_positions), n_active_tokens)


def token_bucket(n_positions, max_cache_id):
    """The token bucket a decoding or window call runs: the first that holds the largest cache id of the WHOLE call,
    every row's (DecoderProgram.find_bucket_id, decoder.py:2169-2170, chosen at :490 and :538-546 at 1ade6d7)."""
    return next(size for size in token_buckets(n_positions) if size >= max_cache_id + 1)


class NeuronModelBase(PretrainedModel, PREPROCESSING[_standin.COMMIT]):
    if _standin.API == "sdk_2_18":

        def save(self, directory):
            self._save(directory)

    else:

        def save(self, directory, sharded_weights=False):
            self._save(directory)

    if _standin.COMMIT == "7a30b42":

        def enable_speculative_decoder(self, speculation_length: list[int] | int | None):
            self._enable(speculation_length, None)

    elif _standin.COMMIT in ("0623de2", "c8d6bdc"):

        def enable_speculative_decoder(
            self, speculation_length: list[int] | int | None, batch_sizes: list[int] | int | None = None
        ):
            self._enable(speculation_length, batch_sizes)

    else:

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
                self.decoder_lm_head_for_speculation[k, size] = "compiled"

    def _artifact_identity(self):
        return {
            "n_positions": self.n_positions,
            "batch_size": self.batch_size,
            "amp": self.amp,
            "tp_degree": self.tp_degree,
            "speculation": sorted(self.decoder_lm_head_for_speculation),
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
