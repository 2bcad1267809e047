"""Stand-in of transformers_neuronx.base.NeuronModelBase: speculation, compile, save/load, to_neuron.

Stricter than the real one where the real one fails late and obscurely: speculative decoders
enabled after `to_neuron()` raise at once, and `load()` of artifacts saved for other constructor
arguments or speculation lengths raises in `to_neuron()`.
"""

import json
import os

from transformers_neuronx import _standin
from transformers_neuronx.module import PretrainedModel

ARTIFACT_FILE = "standin-neffs.json"


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
        self.slots = [None] * self.n_positions

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
