"""Import transformers-neuronx, tell which API generation it is, and drive it only through what we checked.

Two generations are in the field (see tests/standin/neuronx_signatures.json):
- `enable_speculative_decoder(k)` gained `batch_sizes=` after SDK 2.18 (source of April 2024);
- the speculative loop passes batched acceptor shapes `(bs, k-1[, V])` and expects a zero-padded
  `(bs, k)` result from SDK 2.21 (0.13) on; before, unbatched scores and the accepted tokens only.
We detect both from signatures, not version strings (pip builds carry numbers like 0.13.322).
`enable_speculative_decoder` takes a list of k in both (`Optional[Union[List[int], int]]` in base.py
at 7a30b42 and 1ade6d7), so one model holds every window; a build whose signature does not say so
gets one model per k. `fused_speculation.FusedSpeculativeDecoder` exists only in the later generation
(1ade6d7) and is looked up separately (`engine: fused`).

`LlamaForSampling` swallows unknown keyword arguments without a word, so a misspelt or renamed option
would silently compile the wrong model: we pass an explicit allow-list and check that the installed
class declares every name in it.
"""

from __future__ import annotations

import inspect
import re
import warnings
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from neuron_ssp.backends.imports import import_library
from neuron_ssp.config import ModelConfig
from neuron_ssp.errors import Problem, RuntimeProblem

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
    """The installed transformers-neuronx, and the two facts in which its generations differ."""

    version: str
    llama_class: type
    speculation: ModuleType
    speculation_takes_batch_sizes: bool  # enable_speculative_decoder(k, batch_sizes=...)
    batched_acceptor: bool  # acceptor shapes (bs, k-1, V) -> zero-padded (bs, k)
    speculation_takes_k_list: bool = True  # enable_speculative_decoder([2, ..., 8]): one model, every k

    @property
    def generation(self) -> str:
        return "sdk_2_21" if self.batched_acceptor else "sdk_2_18"

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

    def enable_speculation(self, model: Any, ks: list[int]) -> None:
        """Compile one k-token scoring network per k into `model`; must run before `to_neuron()`."""
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
            model.enable_speculative_decoder(lengths, batch_sizes=1)
        else:
            model.enable_speculative_decoder(lengths)


def load_neuronx() -> NeuronxApi:
    """The installed library, or a RuntimeProblem that says what is missing and how to install it."""
    package, llama, speculation = import_library(
        ("transformers_neuronx", "transformers_neuronx.llama.model", "transformers_neuronx.speculation"),
        "platform.backend", "neuron", "transformers-neuronx", INSTALL)
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
    return NeuronxApi(
        version=version,
        llama_class=llama_class,
        speculation=speculation,
        speculation_takes_batch_sizes="batch_sizes" in _parameters(llama_class.enable_speculative_decoder),
        batched_acceptor="pad_token_id" in _parameters(speculation.SpeculativeGenerator.sample),
        speculation_takes_k_list=takes_k_list(llama_class.enable_speculative_decoder),
    )


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
