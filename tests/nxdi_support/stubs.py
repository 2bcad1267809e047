"""Import stubs for the closed-source Neuron modules NxDI and NxD import (torch_neuronx, torch_xla, neuronxcc,
nki, nkilib, libneuronxla) and the TorchScript class namespace `torch.classes.neuron`.

NxDI's CPU path (`NeuronConfig(on_cpu=True)` + `to_cpu()`) imports these modules but runs almost nothing from
them (../shared/vendor/README.md). So a stub module answers every attribute with a `Stub`: a placeholder that
can be imported, subclassed, used as a decorator or an annotation. Calling a stub records its name in
`CALLS`, so a test can assert which stubbed names really ran. Only the names the CPU path executes have
real values (`EXECUTED`): the platform name and the context-parallel source/target pairs.

The finder is APPENDED to sys.meta_path: where the real Neuron packages are installed, they win.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from collections import Counter
from typing import Any

import torch

STUBBED_PACKAGES = ("torch_neuronx", "torch_xla", "neuronxcc", "nki", "nkilib", "libneuronxla")
PLATFORM = "trn1"  # what torch_neuronx.utils.get_platform_target() reports; decides kernel defaults only
CALLS: Counter[str] = Counter()  # stub name -> times called


class Stub:
    """A stand-in for any attribute of a stubbed module."""

    def __init__(self, name: str):
        self._name = name

    def __repr__(self) -> str:
        return f"<stub {self._name}>"

    def __getattr__(self, attr: str) -> Stub:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Stub(f"{self._name}.{attr}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        CALLS[self._name] += 1
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]  # used as a decorator: the decorated function stays itself (never run on CPU)
        return Stub(f"{self._name}()")

    def __getitem__(self, item: Any) -> Stub:
        return Stub(f"{self._name}[]")

    def __or__(self, other: Any) -> Any:
        return Any

    __ror__ = __or__

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        return (type(self._name.rsplit(".", 1)[-1], (), {}),)  # `class X(stubbed.Base)` gets an empty base


class _Collectives:
    """neuronxcc's CollectivesConfig: `initialize_model_parallel` reads `rank_src_tgt_pairs[rank]` even on CPU
    (neuronx_distributed/parallel_layers/parallel_state.py:740 at fbac349b). Ring attention, which uses the
    pairs, does not run on CPU; an empty pair list per rank is what a context-parallel degree of 1 means."""

    def __init__(self, replica_groups: Any = None, **_: Any):
        CALLS["neuronxcc.CollectivesConfig"] += 1
        ranks = [rank for group in replica_groups or [[0]] for rank in group]
        self.rank_src_tgt_pairs = {rank: [] for rank in ranks}


def _platform_target(*_: Any, **__: Any) -> str:
    CALLS["torch_neuronx.get_platform_target"] += 1
    return PLATFORM


class _Argmax:
    """torch_neuronx's Argmax custom op: NxD's `argmax` calls `Argmax.apply(tensor, dim, keepdim)` at tp 1
    (neuronx_distributed/operators/argmax.py:91 at fbac349b), which NxDI's fused speculation uses to pick the
    target's greedy tokens over the window (models/model_base.py:1166 at 4bcdc54b). A stand-in with
    torch.argmax's meaning, the op's documented contract ("Similar to torch.argmax")."""

    @staticmethod
    def apply(tensor: torch.Tensor, dim: int, keepdim: bool = False) -> torch.Tensor:
        CALLS["torch_neuronx.Argmax.apply"] += 1
        return torch.argmax(tensor, dim=dim, keepdim=keepdim)


# torch_xla's reduce-type names (pytorch/xla torch_xla/core/xla_model.py:29-34 at fa72136a): NxD's CPU collectives
# map them to torch.distributed ops (neuronx_distributed/parallel_layers/comm.py:16-20 at fbac349b), which runs at
# tp > 1 only: a stub per attribute read would be a new, unhashable-equal key each time.
REDUCE_TYPES = {"REDUCE_SUM": "sum", "REDUCE_MUL": "mul", "REDUCE_AND": "and", "REDUCE_OR": "or", "REDUCE_MIN": "min"}
REDUCE_TYPES["REDUCE_MAX"] = "max"

EXECUTED: dict[str, dict[str, Any]] = {
    "torch_xla.core.xla_model": REDUCE_TYPES,
    "torch_neuronx.xla_impl.ops": {"Argmax": _Argmax},
    "torch_neuronx.utils": {"get_platform_target": _platform_target},
    "torch_neuronx.utils.utils": {"get_platform_target": _platform_target, "SUPPORTED_TYPES": ()},
    "neuronxcc.nki._private_kernels.collectives": {"CollectivesConfig": _Collectives},
    "neuronxcc.nki._pre_prod_kernels.collectives": {"CollectivesConfig": _Collectives},
}


class StubModule(types.ModuleType):
    """A stubbed package: submodules import, attributes are stubs unless EXECUTED names them."""

    def __init__(self, name: str):
        super().__init__(name)
        self.__path__: list[str] = []
        self.__dict__.update(EXECUTED.get(name, {}))

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Stub(f"{self.__name__}.{attr}")


class StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname.split(".")[0] not in STUBBED_PACKAGES:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return StubModule(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def install() -> list[str]:
    """Append the finder (once) and give `torch.classes` a `neuron` namespace when no real one is
    registered; returns what was stubbed, for the test report."""
    stubbed = [
        name
        for name in STUBBED_PACKAGES
        if importlib.util.find_spec(name) is None or isinstance(sys.modules.get(name), StubModule)
    ]
    if not any(isinstance(finder, StubFinder) for finder in sys.meta_path):
        sys.meta_path.append(StubFinder())
    if not _real_neuron_classes():
        torch.classes.neuron = Stub("torch.classes.neuron")  # annotations such as List[...SPMDModel]
        stubbed.append("torch.classes.neuron")
    return stubbed


def _real_neuron_classes() -> bool:
    namespace = torch.classes.__dict__.get("neuron")
    if isinstance(namespace, Stub):
        return False
    try:
        torch.classes.neuron.SPMDModel  # noqa: B018 - registered by torch_neuronx's C++ library
    except (RuntimeError, AttributeError):
        return False
    return True
