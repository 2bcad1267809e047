"""The patches of NxDI behaviour that running it on CPU needs: explicit, limited to tests, and asserted against
the source they replace, so an upstream change fails here loudly instead of silently testing something else.

What runs on hardware and what the tests put in its place (all at NxDI 4bcdc54b, NxD fbac349b):
1. `compile(dir)` traces with neuronx-cc and `load(dir, start_rank_id, local_ranks_size)` puts NEFFs on the
   device (application_base.py:292, 318). In tests `compile` saves NxDI's own config (`config.save`, what it
   writes first) and a marker for model.pt, and `load` runs NxDI's CPU mode, `to_cpu()` (application_base.py:556),
   which builds the same modules eagerly. Both record their arguments in `DEVICE_CALLS`.
2. `to_cpu()` refuses speculation ("Speculation is not yet supported for CPU inference."). The guard is lifted by
   building with speculation_length 0 and restoring it afterwards on the config and on every eager
   `NeuronBaseModel` (which copies it at __init__, model_base.py:89).
3. On CPU all sub-models share one eager model and NxDI copies the returned KV cache back into it
   (`_copy_past_key_values`, model_base.py:3761). For a speculation target it writes through
   `token_generation_model`, which such a target does not have (`enable_speculation` replaces it): the test
   points that name at the speculation model, whose eager model is the same shared one. For fused speculation
   the copy reads `fused_spec_model.draft_model`, an attribute ModelWrapper does not have: the test replaces
   the fused branch with the same copy done through the wrapped eager models, into the context-encoding and the
   fused model alike, as NxDI's branch means to (model_base.py:3767-3779; with continuous batching each wrapper
   has an eager model of its own, application_base.py:612-619). The non-fused branch is NxDI's.
5. A fused load sets `NeuronLlamaForCausalLM._FUSED_PREFIX = "target_model"` on the class and never resets it
   (`checkpoint_loader_fn`, application_base.py:668-672), so every later model of the process would look for
   prefixed checkpoint keys. Each test ends with the class attribute restored (one model per process in use).
4. On CPU NxDI's ModelBuilder (which builds the draft's process group through `init_custom_process_group_fn`,
   application_base.py:61) never runs; the test calls the same function right after `to_cpu()` initialises
   model parallelism.
6. On hardware every bucket is a graph of its own, traced after `DecoderModelInstance.get(bucket_rank)` sets the
   module's n_positions (and a fused model's draft and target's) to that bucket (model_wrapper.py:1548-1576). On
   CPU one eager model, built at n_positions = seq_len, serves every bucket: before each call its n_positions is
   set to the bucket the wrapper padded the inputs to (the attention mask's width, `pad_inputs`), as `get` would
   have for that graph, and restored after.
7. A call with fewer rows than the compiled batch is padded to it; on CPU the wrapper then copies the returned
   caches through `self.model.kv_mgr` (ModelWrapper.forward, model_wrapper.py:1417-1420), which a fused model
   lacks (its caches are its draft's and target's, and the list it copies starts with the three next-step
   tensors). The test gives each fused eager model a `kv_mgr` whose writes go nowhere: the copy NxDI makes right
   after (`_copy_past_key_values`, patch 3) writes the caches where they belong.
8. An EAGLE model keeps the hidden states it hands the head in a rolling buffer of speculation_length * 2 positions
   per row (`HiddenStateRollingBuffer`, model_base.py:1614-1622, modules/eagle/hidden_state.py). Patch 2 builds it
   at speculation_length 0 (a zero-length buffer); it is rebuilt at 2k, zeroed, as NxDI builds it.
9. On hardware that buffer is an aliased state like the KV caches: its new value, the call's last output, is
   written back into it (model_wrapper.py:1607-1610). On CPU NxDI writes nothing back (set_state is not in place,
   hidden_state.py:124-146), so the copy-back of patch 3 writes it into every eager fused model.
10. On hardware each wrapper is a graph traced with its own config: the decoding graphs without sequence
   parallelism (model_base.py:3093-3094). On CPU without continuous batching one eager model built from the
   base config serves them all, so a sequence-parallel model (EAGLE-3's target) would slice every decoding call
   to its last position. Such a model gets one eager model per wrapper, from that wrapper's config, as NxDI's CPU
   mode does for continuous batching (application_base.py:612-619).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

DEVICE_CALLS: list[tuple[str, str, dict[str, Any]]] = []  # (model dir name, "compile" | "load", arguments)
CPU_GUARD = "Speculation is not yet supported for CPU inference."
FUSED_COPY_BUG = "self.fused_spec_model.draft_model.layers"
PADDED_CPU_COPY = "self.model.kv_mgr.past_key_values[i].data = kv_cache"


def _require(source_of: Any, text: str, what: str) -> None:
    source = inspect.getsource(source_of)
    assert text in source, (
        f"NxDI changed: {source_of.__qualname__} no longer contains {text!r} ({what}); revisit tests/nxdi_support/"
        "patches.py"
    )


def _require_parameters(func: Any, names: tuple[str, ...]) -> None:
    parameters = list(inspect.signature(func).parameters)
    assert parameters[: len(names)] == list(names), f"NxDI changed the signature of {func.__qualname__}: {parameters}"


@contextmanager
def cpu_device() -> Iterator[None]:
    """NxDI's compile and load replaced by its CPU mode, for the duration of the context."""
    from neuronx_distributed_inference.models import application_base, model_base, model_wrapper
    from neuronx_distributed_inference.models.application_base import NeuronApplicationBase
    from neuronx_distributed_inference.models.model_base import NeuronBaseForCausalLM

    app_cls = NeuronApplicationBase
    _require_parameters(app_cls.compile, ("self", "compiled_model_path"))
    _require_parameters(app_cls.load, ("self", "compiled_model_path", "start_rank_id", "local_ranks_size"))
    _require(app_cls.to_cpu, CPU_GUARD, "the CPU guard on speculation")
    _require(app_cls.to_cpu, "initialize_model_parallel(", "model parallelism set up in to_cpu")
    _require(
        NeuronBaseForCausalLM._copy_past_key_values,
        "self.token_generation_model.model.kv_mgr",
        "the KV copy-back through token_generation_model",
    )
    _require(NeuronBaseForCausalLM._copy_past_key_values, FUSED_COPY_BUG, "the fused KV copy-back")
    _require(
        NeuronApplicationBase.checkpoint_loader_fn,
        'self.__class__._FUSED_PREFIX = "target_model"',
        "the class-wide fused checkpoint prefix",
    )
    _require(
        model_base.NeuronBaseModel.__init__,
        "self.speculation_length = config.neuron_config.speculation_length",
        "the eager model's copy of speculation_length",
    )
    _require(
        model_wrapper.DecoderModelInstance.get,
        "self.module.n_positions = bucket_value",
        "a bucket's graph traced at n_positions = the bucket",
    )
    _require(model_wrapper.ModelWrapper.forward, PADDED_CPU_COPY, "the padded batch's CPU copy-back")
    _require(app_cls.to_cpu, "for model_wrapper in self.models:", "an eager model per wrapper (continuous batching)")

    saved = (
        app_cls.compile,
        app_cls.load,
        NeuronBaseForCausalLM._copy_past_key_values,
        application_base.initialize_model_parallel,
        model_wrapper.ModelWrapper._forward,
    )
    prefixes = {cls: cls.__dict__["_FUSED_PREFIX"] for cls in _subclasses(app_cls) if "_FUSED_PREFIX" in cls.__dict__}
    app_cls.compile = _compile
    app_cls.load = _load
    NeuronBaseForCausalLM._copy_past_key_values = _copy_back(saved[2])
    model_wrapper.ModelWrapper._forward = _at_bucket(saved[4])
    try:
        yield
    finally:
        (
            app_cls.compile,
            app_cls.load,
            NeuronBaseForCausalLM._copy_past_key_values,
            application_base.initialize_model_parallel,
            model_wrapper.ModelWrapper._forward,
        ) = saved
        for cls in _subclasses(app_cls):  # patch 5
            if cls in prefixes:
                cls._FUSED_PREFIX = prefixes[cls]
            elif "_FUSED_PREFIX" in cls.__dict__:
                del cls._FUSED_PREFIX


def _subclasses(cls: type) -> list[type]:
    return [cls, *(sub for child in cls.__subclasses__() for sub in _subclasses(child))]


def _compile(self: Any, compiled_model_path: str, *args: Any, **kwargs: Any) -> None:
    DEVICE_CALLS.append((Path(self.model_path).name, "compile", {"path": compiled_model_path}))
    self.config.save(compiled_model_path)  # what NxDI's compile writes first (neuron_config.json)
    (Path(compiled_model_path) / "model.pt").write_text("traced on CPU by the test stand-in\n")
    self.is_compiled = True


def _load(
    self: Any,
    compiled_model_path: str,
    start_rank_id: int | None = None,
    local_ranks_size: int | None = None,
    skip_warmup: bool = False,
) -> None:
    saved = json.loads((Path(compiled_model_path) / "neuron_config.json").read_text())
    assert saved["neuron_config"]["speculation_length"] == self.neuron_config.speculation_length, (
        "loading a directory compiled for another speculation_length"
    )
    DEVICE_CALLS.append(
        (
            Path(self.model_path).name,
            "load",
            {"path": compiled_model_path, "start_rank_id": start_rank_id, "local_ranks_size": local_ranks_size},
        )
    )
    to_cpu(self)


def to_cpu(app: Any) -> None:
    """NxDI's own CPU mode with the speculation guard lifted (patch 2) and the draft group built (patch 4)."""
    import torch
    from neuronx_distributed_inference.models import application_base
    from neuronx_distributed_inference.models.model_base import NeuronBaseModel
    from neuronx_distributed_inference.modules.eagle.hidden_state import HiddenStateRollingBuffer

    nc = app.neuron_config
    k = nc.speculation_length
    nc.on_cpu = True  # NxDI's CPU mode flag (its sampler takes torch paths with it)
    init = application_base.initialize_model_parallel

    def initialize_with_draft_group(*args: Any, **kwargs: Any) -> None:
        init(*args, **kwargs)
        application_base.init_custom_process_group_fn(app.config)

    application_base.initialize_model_parallel = initialize_with_draft_group
    nc.speculation_length = 0
    continuous = nc.is_continuous_batching
    nc.is_continuous_batching = continuous or nc.sequence_parallel_enabled  # patch 10
    try:
        app.to_cpu()
    finally:
        nc.speculation_length = k
        nc.is_continuous_batching = continuous
        application_base.initialize_model_parallel = init
    eager = {id(wrapper.model): wrapper.model for wrapper in app.models}.values()  # one, or one per wrapper
    for module in (m for model in eager for m in model.modules()):
        if isinstance(module, NeuronBaseModel):
            module.speculation_length = module.neuron_config.speculation_length
        if isinstance(module, HiddenStateRollingBuffer):  # patch 8: sized by speculation_length * 2
            module.buffer_length = 2 * k
            module.shape = (module.max_batch_size + 1, module.buffer_length, module.shape[2])
            module.hidden_states = torch.nn.Parameter(
                torch.zeros(module.shape, dtype=module.hidden_states.dtype), False
            )
    for model in eager if nc.enable_fused_speculation else ():  # patch 7
        assert not hasattr(model, "kv_mgr"), "NxDI's fused model now has a kv_mgr of its own"
        model.kv_mgr = SimpleNamespace(past_key_values=_Discard())
    if k and not nc.enable_fused_speculation:
        assert not hasattr(app, "token_generation_model"), "NxDI now builds a token-generation model beside speculation"
        app.token_generation_model = app.speculation_model  # patch 3: the same shared eager model


class _Discard:
    """`past_key_values` of patch 7's kv_mgr: every line is a fresh object, so the write lands nowhere."""

    def __getitem__(self, index: int) -> SimpleNamespace:
        return SimpleNamespace()


def _copy_back(original: Any) -> Any:
    """NxDI's KV copy-back, with its fused branch done through the wrapped eager models (patch 3)."""

    def copy_past_key_values(self: Any, outputs: list[Any]) -> None:
        if not self.neuron_config.enable_fused_speculation:
            return original(self, outputs)
        caches = outputs[4:]  # after accepted tokens, next input ids, next attention mask, next position ids
        eagle = self.neuron_config.enable_eagle_speculation
        if eagle:  # patch 9: the rolling buffer of hidden states, aliased after the caches (model_wrapper.py:1607)
            *caches, hidden_states = caches
        # the eager NeuronFusedSpecModel(s): one shared by every wrapper, or one each with continuous batching
        for fused in {id(w.model): w.model for w in (self.context_encoding_model, self.fused_spec_model)}.values():
            if eagle:
                fused.hidden_state_rolling_buffer.hidden_states.data = hidden_states
            draft_cache = fused.draft_model.kv_mgr.past_key_values
            for i, tensor in enumerate(caches[: len(draft_cache)]):
                draft_cache[i].data = tensor
            for i, tensor in enumerate(caches[len(draft_cache) :]):
                fused.target_model.kv_mgr.past_key_values[i].data = tensor
        return None

    return copy_past_key_values


def _at_bucket(original: Any) -> Any:
    """The wrapper's call with the shared eager model set to the bucket its inputs were padded to (patch 6)."""

    def forward(self: Any, *args: Any) -> Any:
        module = self.model
        modules = (
            [module, module.draft_model, module.target_model]
            if self.neuron_config.enable_fused_speculation
            else [module]
        )
        saved = [m.n_positions for m in modules]
        for m in modules:
            m.n_positions = args[1].shape[1]  # the attention mask, padded to the bucket by pad_inputs
        try:
            return original(self, *args)
        finally:
            for m, n_positions in zip(modules, saved, strict=True):
                m.n_positions = n_positions

    return forward
