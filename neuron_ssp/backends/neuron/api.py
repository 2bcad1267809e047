"""Import transformers-neuronx, tell what the installed build does, and drive it only through what we checked.

Builds differ in what matters to us, and a build is known by what it does, not by one keyword (tests/standin ports
each public commit: 7a30b42 = 0.10, 0623de2 = 0.10 with `batch_sizes=`, c8d6bdc = 0.11, 1ade6d7 = 0.13):
- `enable_speculative_decoder(k, batch_sizes=)`: a speculation network per (k, batch size), from 0623de2 on
  (base.py:76-87 there; 7a30b42 compiles each k for one batch, line 76);
- whether its preprocessing keeps a batched call's cache ids (probe.py: 0623de2 rewrites a 2-D window's to
  arange(bucket), base.py:291-295; c8d6bdc and 1ade6d7 keep them), run on the host at import;
- whether `SpeculativeGenerator.sample` takes the `attention_mask` of its batched loop and passes batched acceptor
  shapes `(bs, k-1[, V])`, expecting a zero-padded `(bs, k)` result (SDK 2.21, 0.13, 1ade6d7 speculation.py:677-867);
  before, unbatched scores and the accepted tokens only.
topology/batch_rules.py turns those behaviours into the generation whose rules apply (`NeuronxBehaviour`), and the
loader validates the config against it: the same table `validate` uses with a version alone.
`enable_speculative_decoder` takes a list of k in every generation (`Optional[Union[List[int], int]]` in base.py
at 7a30b42 and 1ade6d7), so one model holds every window; a build whose signature does not say so
gets one model per k. `fused_speculation.FusedSpeculativeDecoder` exists only in 1ade6d7 of the public commits and
is looked up separately (`engine: fused`).

`LlamaForSampling` swallows unknown keyword arguments without a word, so a misspelt or renamed option
would silently compile the wrong model: we pass an explicit allow-list and check that the installed
class declares every name in it.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import re
import warnings
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from neuron_ssp.backends.imports import import_library
from neuron_ssp.backends.neuron.probe import window_kept
from neuron_ssp.config import ModelConfig
from neuron_ssp.errors import Problem, RuntimeProblem
from neuron_ssp.topology.batch_rules import NeuronxBehaviour
from neuron_ssp.topology.parallelism import KV_PADDING, KV_REPLICATED_TO_HEADS

SUPPORTED = "transformers-neuronx 0.10.x to 0.13.x (Neuron SDK 2.18 to 2.25)"
SUPPORTED_MINORS = range(10, 14)
NEURON_INDEX = "https://pip.repos.neuron.amazonaws.com"
INSTALL = (
    f"on a Neuron DLAMI: source /opt/aws_neuronx_venv_pytorch_2_7_transformers/bin/activate; elsewhere: "
    f"pip install transformers-neuronx --extra-index-url={NEURON_INDEX} (the PyPI package of that name "
    "is a placeholder). Without Neuron hardware use platform.backend: torch"
)
AMP = {"fp32": "f32", "bf16": "bf16", "fp16": "f16"}
CONSTRUCTOR_ARGS = ("n_positions", "batch_size", "amp", "tp_degree")  # the only ones we ever pass
REQUIRED_METHODS = (
    "forward",
    "speculative_forward",
    "enable_speculative_decoder",
    "to_neuron",
    "save",
    "load",
)


@dataclass(frozen=True)
class NeuronxApi:
    """The installed transformers-neuronx, and what it does where its builds differ."""

    version: str
    llama_class: type
    speculation: ModuleType
    speculation_takes_batch_sizes: bool  # enable_speculative_decoder(k, batch_sizes=...)
    batched_acceptor: bool  # acceptor shapes (bs, k-1, V) -> zero-padded (bs, k)
    speculation_takes_k_list: bool = True  # enable_speculative_decoder([2, ..., 8]): one model, every k
    kv_rule: str = KV_PADDING  # how it lays out kv heads tp does not divide (topology.parallelism.KV_RULES)
    neuron_config_class: type | None = None  # transformers_neuronx.config.NeuronConfig
    worker_count_in_config: bool = False  # NeuronConfig(compilation_worker_count=) (1ade6d7 config.py line 239)
    continuous_batching_class: type | None = None  # transformers_neuronx.config.ContinuousBatchingConfig
    window_kept: str | None = "not checked"  # probe.window_kept: None when a batched call keeps its cache ids
    loop_takes_attention_mask: bool = False  # SpeculativeGenerator.sample(attention_mask=): its batched loop

    @property
    def behaviour(self) -> NeuronxBehaviour:
        """What the batch rules key on (topology/batch_rules.py)."""
        return NeuronxBehaviour(
            self.version,
            self.speculation_takes_batch_sizes,
            self.continuous_batching_class is not None,
            self.window_kept,
            self.loop_takes_attention_mask,
        )

    @property
    def generation(self) -> str:
        return self.behaviour.generation

    def constructor_kwargs(self, model: ModelConfig) -> dict[str, Any]:
        """from_pretrained arguments: the allow-list, nothing else. Identical for compile and load."""
        return {
            "n_positions": model.n_positions,
            "batch_size": model.batch_size,
            "amp": AMP[model.dtype],
            "tp_degree": model.tp_degree,
        }

    @property
    def finishes_greedily(self) -> bool:
        """0.10-0.11 (7a30b42, c8d6bdc): `SpeculativeGenerator.sample` hands the last <= k tokens to
        `target.sample(..., top_k=1)`, i.e. greedy whatever the acceptor does."""
        return not self.batched_acceptor

    def continuous_batching_options(self, batch_size: int) -> dict[str, Any]:
        """NeuronConfig keywords for a KV cache of `batch_size` sequences, each prefilled into its own slot (none
        at batch 1). `batch_size_for_shared_caches` is the name both generations take (1ade6d7 config.py line
        79, 7a30b42 line 52); NeuronConfig refuses unknown keywords (1ade6d7 config.py line 315)."""
        if batch_size == 1:
            return {}
        assert self.continuous_batching_class is not None, "the batch rules refuse this build first"
        return {"continuous_batching": self.continuous_batching_class(batch_size_for_shared_caches=batch_size)}

    def static_batch_options(self, batch_size: int) -> dict[str, Any]:
        """NeuronConfig keywords of a model SpeculativeGenerator runs at a static batch (`engine: library`): right
        padding (none at batch 1). Its batched `sample` sends right-padded prompts with 2-D cache_ids
        (speculation.py:722-728 at 1ade6d7), which the models read only with `padding_side='right'` (config.py:214,
        :254-259 `lhs_aligned`). No continuous batching: from k = 3 its draft step sends int32 cache_ids with int64
        tokens (speculation.py:356), which the continuous-batching scatter refuses (base.py:585), and `sample` takes
        its rows at the start. (`engine: fused` batches continuously: its decoder advances rows on the device,
        fused_speculation.py:173-202, through speculative_iteration, :746.)"""
        if batch_size == 1:
            return {}
        assert self.neuron_config_class is not None, "the batch rules refuse a build without NeuronConfig first"
        return {"padding_side": "right"}

    def enable_speculation(self, model: Any, ks: list[int], batch_size: int = 1) -> None:
        """Compile one k-token scoring network per k into `model` (for `batch_size` rows); must run before
        `to_neuron()`."""
        if len(ks) > 1 and not self.speculation_takes_k_list:
            raise RuntimeProblem(
                Problem(
                    "transformers-neuronx",
                    self.version,
                    f"this build's enable_speculative_decoder takes one k, not the list {ks}",
                    "compile one k per model (neuron-ssp compile does that for this build), or upgrade",
                )
            )
        lengths: int | list[int] = ks if len(ks) > 1 else ks[0]
        if self.speculation_takes_batch_sizes:
            model.enable_speculative_decoder(lengths, batch_sizes=batch_size)
        else:
            model.enable_speculative_decoder(lengths)


def bound_parallel_compile(model: Any, workers: int) -> None:
    """Builds without compilation_worker_count (0.10-0.12): their `to_neuron()` calls `self.compile()`,
    which runs one neuronx-cc process per network unless given `parallel_degree` (base.py `compile`,
    line 45 at 7a30b42). The model's own compile is given the bound."""
    model.compile = functools.partial(type(model).compile, model, parallel_degree=workers)


def load_neuronx() -> NeuronxApi:
    """The installed library, or a RuntimeProblem that says what is missing and how to install it."""
    package, llama, speculation = import_library(
        ("transformers_neuronx", "transformers_neuronx.llama.model", "transformers_neuronx.speculation"),
        "platform.backend",
        "neuron",
        "transformers-neuronx",
        INSTALL,
    )
    version = str(getattr(package, "__version__", "unknown"))
    llama_class = getattr(llama, "LlamaForSampling", None)
    missing = [name for name in REQUIRED_METHODS if not hasattr(llama_class, name)]
    if llama_class is not None:
        declared = inspect.signature(llama_class.__init__).parameters
        missing += [f"LlamaForSampling({arg}=)" for arg in CONSTRUCTOR_ARGS if arg not in declared]
    missing += [
        f"speculation.{name}" for name in ("TokenAcceptor", "SpeculativeGenerator") if not hasattr(speculation, name)
    ]
    if llama_class is None or missing:
        raise RuntimeProblem(
            Problem(
                "transformers-neuronx",
                version,
                f"this version lacks {', '.join(missing) or 'LlamaForSampling'}; supported: {SUPPORTED}",
                "install a supported version: pip install 'transformers-neuronx<0.14' "
                f"--extra-index-url={NEURON_INDEX}",
            )
        )
    _warn_if_unknown_version(version)
    config_module = _optional_module("transformers_neuronx.config")
    neuron_config_class = getattr(config_module, "NeuronConfig", None)
    continuous_batching_class = getattr(config_module, "ContinuousBatchingConfig", None)
    takes_batch_sizes = "batch_sizes" in _parameters(llama_class.enable_speculative_decoder)
    sample = _parameters(speculation.SpeculativeGenerator.sample)
    return NeuronxApi(
        version=version,
        llama_class=llama_class,
        speculation=speculation,
        speculation_takes_batch_sizes=takes_batch_sizes,
        batched_acceptor="pad_token_id" in sample,
        speculation_takes_k_list=takes_k_list(llama_class.enable_speculative_decoder),
        kv_rule=installed_kv_rule(),
        neuron_config_class=neuron_config_class,
        worker_count_in_config=neuron_config_class is not None
        and "compilation_worker_count" in _parameters(neuron_config_class.__init__),
        continuous_batching_class=continuous_batching_class,
        window_kept=window_kept(llama_class, neuron_config_class, continuous_batching_class)
        if takes_batch_sizes and neuron_config_class and continuous_batching_class
        else "not checked: this build compiles no speculation network per batch size",
        loop_takes_attention_mask="attention_mask" in sample,
    )


def _optional_module(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def installed_kv_rule() -> str:
    """0.10 (7a30b42, 0623de2) replicates kv heads up to the query heads; `utils.get_qkv_padding`, which
    replicates them only up to tp where it can, ships from c8d6bdc on."""
    utils = _optional_module("transformers_neuronx.utils")
    return KV_PADDING if hasattr(utils, "get_qkv_padding") else KV_REPLICATED_TO_HEADS


def takes_k_list(enable_speculative_decoder: Any) -> bool:
    """Whether `speculation_length` is declared as a list too (`Optional[Union[List[int], int]]`)."""
    parameter = inspect.signature(enable_speculative_decoder).parameters.get("speculation_length")
    return parameter is not None and "list" in str(parameter.annotation).lower()


def _parameters(func: Any) -> set[str]:
    return set(inspect.signature(func).parameters)


def _warn_if_unknown_version(version: str) -> None:
    match = re.match(r"(\d+)\.(\d+)", version)
    if match and (int(match[1]) != 0 or int(match[2]) not in SUPPORTED_MINORS):
        warnings.warn(
            f"transformers-neuronx {version} is outside the tested range ({SUPPORTED}); its "
            "signatures match what we call, so we go on",
            stacklevel=3,
        )
