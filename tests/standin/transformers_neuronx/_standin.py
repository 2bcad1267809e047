"""Stand-in bookkeeping (test-only; no such module exists in the real library).

One "process" of the Neuron runtime: which cores are visible once it started, which core sets are
initialised, and an event log of every call the code under test made, in order.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

# NEURONX_STANDIN_COMMIT: which public commit of transformers-neuronx to imitate, each ported from its source:
# 7a30b42 (0.10), 0623de2 (0.10 with enable_speculative_decoder(batch_sizes=)), c8d6bdc (0.11), 1ade6d7 (0.13).
# NEURONX_STANDIN_API=sdk_2_18 / sdk_2_21 name the first and the last (the two signature sets of
# neuronx_signatures.json), for the tests that only tell the two loop generations apart.
# the version each reports, numbered as the pip builds are (0623de2's build number is not known: only its 0.10 counts)
COMMITS = {"7a30b42": "0.10.0.21", "0623de2": "0.10.0.360", "c8d6bdc": "0.11.351", "1ade6d7": "0.13.322"}
_BY_API = {"sdk_2_18": "7a30b42", "sdk_2_21": "1ade6d7"}
COMMIT = os.environ.get("NEURONX_STANDIN_COMMIT") or _BY_API.get(os.environ.get("NEURONX_STANDIN_API", "sdk_2_21"), "")
if COMMIT not in COMMITS:
    raise ImportError(f"NEURONX_STANDIN_COMMIT must be one of {sorted(COMMITS)}")
# the speculative loop's generation: speculation.py is the same file at 7a30b42, 0623de2 and c8d6bdc
API = "sdk_2_21" if COMMIT == "1ade6d7" else "sdk_2_18"
DEVICE_CORES = 32  # a trn1.32xlarge unless a test says otherwise
# NEURONX_STANDIN_ONE_K=1 imitates a build whose enable_speculative_decoder takes a single int (its
# signature does not declare a list), so each k needs its own model.
ONE_K = os.environ.get("NEURONX_STANDIN_ONE_K") == "1"


@dataclass
class Runtime:
    started: bool = False
    visible: list[int] = field(default_factory=list)
    core_sets: list[frozenset[int]] = field(default_factory=list)
    events: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)

    def record(self, model: str, call: str, **details: Any) -> None:
        self.events.append((model, call, details))

    def calls(self, model: str | None = None) -> list[str]:
        return [call for who, call, _ in self.events if model is None or who == model]

    def start(self) -> None:
        """The runtime reads NEURON_RT_VISIBLE_CORES once, when the first model goes to the device."""
        if self.started:
            return
        self.visible = parse_cores(os.environ.get("NEURON_RT_VISIBLE_CORES"), DEVICE_CORES)
        self.started = True

    def claim(self, tp_degree: int) -> frozenset[int]:
        """transformers-neuronx places every model of a process from the first visible core."""
        self.start()
        if tp_degree > len(self.visible):
            raise RuntimeError(
                f"nrt_load: tp_degree {tp_degree} needs {tp_degree} NeuronCores, "
                f"{len(self.visible)} are visible (NEURON_RT_VISIBLE_CORES)"
            )
        cores = frozenset(self.visible[:tp_degree])
        for taken in self.core_sets:
            if taken != cores and taken & cores:
                raise RuntimeError(
                    f"nrt_load: NeuronCores {sorted(cores)} partially overlap NeuronCores {sorted(taken)} "
                    "already initialised by this process; a model must use the same cores as another "
                    "model or disjoint ones"
                )
        if cores not in self.core_sets:
            self.core_sets.append(cores)
        return cores


def parse_cores(spec: str | None, device_cores: int) -> list[int]:
    if not spec:
        return list(range(device_cores))
    first, _, last = spec.partition("-")
    cores = list(range(int(first), int(last or first) + 1))
    if cores[-1] >= device_cores:
        raise RuntimeError(f"NEURON_RT_VISIBLE_CORES={spec}: this instance has {device_cores} NeuronCores")
    return cores


RUNTIME = Runtime()


def reset() -> None:
    """A fresh process: nothing started, nothing recorded."""
    global RUNTIME
    RUNTIME = Runtime()


class PrefixScorer:
    """Logits after a prefix of token ids, as a function of that prefix alone.

    Every prefix is fed one token per step over a KV cache of the last sequence scored; a prefix that
    differs from it is recomputed from the first token that differs. Because each step always feeds one
    token onto the cache of the same tokens, the logits of a prefix never depend on the order in which
    prefixes are asked for (a window and one-token calls at the same slots agree bit for bit), and
    re-reading a known prefix costs nothing.
    """

    def __init__(self, model):
        self.model = model
        self.tokens: list[int] = []
        self.rows: list = []
        self.cache = None

    def logits_after(self, prefix: list[int]):
        same = 0
        for known, token in zip(self.tokens, prefix, strict=False):  # the prefix may be longer or shorter
            if known != token:
                break
            same += 1
        if same == 0 or self.cache is None:
            from transformers import DynamicCache

            self.tokens, self.rows, self.cache = [], [], DynamicCache()
        elif same < len(self.tokens):
            self.cache.crop(same - len(self.tokens))  # a negative count drops that many (transformers 4 and 5)
            self.tokens, self.rows = self.tokens[:same], self.rows[:same]
        import torch

        from neuron_ssp.backends.torch.hf_forward import cache_kwarg  # the cache's name moved in transformers 5.24

        cache = {cache_kwarg(self.model): self.cache}
        for token in prefix[len(self.tokens) :]:
            out = self.model(input_ids=torch.tensor([[token]]), **cache, use_cache=True)
            self.tokens.append(token)
            self.rows.append(out.logits[0, -1])
        return self.rows[len(prefix) - 1]
