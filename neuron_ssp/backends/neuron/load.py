"""Load the draft and the speculation-enabled target onto NeuronCores through transformers-neuronx.

Order matters on Neuron, so it is spelt out here: the config is checked for the build installed (resolve.py: a
bad placement would otherwise fail minutes into a load), `NEURON_RT_VISIBLE_CORES` and the compile cache are set
before the runtime starts, then per model in the plan's load order: `from_pretrained` with allow-listed arguments,
`enable_speculative_decoder(ks)` on the target, `load(dir)` of compiled artifacts when they match,
and `to_neuron()` last. A target compiled by `neuron-ssp compile --k 2..8` holds every k; the backend
picks the window at run time (`speculative_forward(..., speculation_length=k)`).
At batch > 1 our loop's models are compiled with continuous batching (each request prefilled into its own
cache slot) and scored by `BatchedNeuronBackend`; a library build that cannot is refused before any load, by the
batch rules `validate` applies, keyed by what the installed build does (api.py, probe.py).
The library's own loop (engine library) takes a static batch instead: both models at `batch_size` B with right
padding, the target's speculation networks at (k, B) (`api.static_batch_options`); engine fused's models are built
for continuous batching, like our loop's.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

from neuron_ssp.backends.neuron.api import NeuronxApi, bound_parallel_compile, load_neuronx
from neuron_ssp.backends.neuron.artifacts import ArtifactStore, artifact_spec
from neuron_ssp.backends.neuron.batched import BatchedNeuronBackend
from neuron_ssp.backends.neuron.env import device_nodes, host_memory_available
from neuron_ssp.backends.neuron.on_device import OnDeviceBackend, load_fused_modules, on_device_options
from neuron_ssp.backends.neuron.scoring import NeuronBackend
from neuron_ssp.backends.neuron.selftest import check_self_test, self_test, static_batch_self_test_skip
from neuron_ssp.backends.resolve import ModelDirs, model_config, resolve_models
from neuron_ssp.config import Config, ModelConfig
from neuron_ssp.errors import Problem, RuntimeProblem, UsageError
from neuron_ssp.topology import DeploymentPlan
from neuron_ssp.topology.compile_plan import PROCESS_BYTES, CompileEstimate, estimate_compile
from neuron_ssp.topology.parallelism import KV_PADDING
from neuron_ssp.topology.placement import loaded_models
from neuron_ssp.topology.plan import place_models

VISIBLE_CORES_ENV = "NEURON_RT_VISIBLE_CORES"
COMPILE_CACHE_ENV = "NEURON_COMPILE_CACHE_URL"


def load_neuron_backends(config: Config, plan: DeploymentPlan, dirs: ModelDirs | None = None) -> tuple[Any, Any]:
    """(target, draft) on Neuron; the draft is None unless `speculation.drafter` is 'model'. `dirs`: the pipeline's
    checked models (checked for the installed build and resolved here when not given)."""
    dirs = dirs or resolve_models(config)
    api = prepare_runtime(config, plan)
    workers = compile_estimate(config).bound  # a model without saved artifacts compiles now
    if config.speculation.engine == "fused":
        return load_on_device_backends(api, config, plan, workers, dirs)
    store = ArtifactStore(config.neuron.compiled_dir) if config.neuron.compiled_dir else None
    backends: dict[str, NeuronBackend] = {}
    for role in plan.load_order:
        model_cfg = model_config(config, role)
        k = speculation_length(config, role)
        model_dir = dirs.of(role)
        windows, artifacts = ([k] if k else None), None
        options = scoring_options(api, config, model_cfg)
        if store is not None:
            spec = artifact_spec(
                role,
                model_dir,
                artifact_constructor(api, model_cfg, options),
                windows,
                api.version,
                one_k_per_model=not api.speculation_takes_k_list,
            )
            if k is None:
                artifacts = store.find(spec)
            elif found := store.find_for_window(spec, k):
                artifacts, windows = found
        model = build_model(api, model_dir, model_cfg, windows, artifacts, options, workers)
        vocab_size = int(model.config.vocab_size)
        backends[role] = (
            BatchedNeuronBackend(model, role, vocab_size, model_cfg.n_positions, k, windows, slots=model_cfg.batch_size)
            if "continuous_batching" in options
            else NeuronBackend(model, role, vocab_size, model_cfg.n_positions, k, windows)
        )
    if config.neuron.self_test:
        if skipped := static_batch_self_test_skip(config):
            warnings.warn(skipped, stacklevel=2)
        else:
            check_self_test(self_test(backends["target"], config, api.version, dirs.target))
    return backends["target"], backends.get("draft")


def load_on_device_backends(
    api: NeuronxApi, config: Config, plan: DeploymentPlan, workers: int | None, dirs: ModelDirs
) -> tuple[Any, Any]:
    """engine fused: both models with on-device embedding and generation, no speculation network of their
    own (the fused decoder compiles its graph from them), and at batch > 1 continuous batching (rows join and leave
    through the decoder's speculative_iteration: engines/fused.py). Compiled at every load: the fused graph is not
    in what `save()` writes, and models returning token ids cannot be self-tested against logits."""
    if config.neuron.compiled_dir:
        warnings.warn("engine fused compiles at every load: neuron.compiled_dir is not used", stacklevel=3)
    backends = {}
    for role in plan.load_order:
        model_cfg = model_config(config, role)
        model_dir = dirs.of(role)
        options = {**on_device_options(config, model_dir), **api.continuous_batching_options(model_cfg.batch_size)}
        model = build_model(api, model_dir, model_cfg, None, None, options, workers)
        backends[role] = OnDeviceBackend(model, role, int(model.config.vocab_size), model_cfg.n_positions, model_dir)
    return backends["target"], backends.get("draft")


def fused_decoder(
    config: Config, target: OnDeviceBackend, draft: OnDeviceBackend, k: int, pad_token_id: int, eos_token_id: int | None
) -> Any:
    """transformers-neuronx's FusedSpeculativeDecoder over the two loaded models (`k`: its own count, the tokens the
    draft speculates), its fused graphs compiled now with at most compile_estimate's bound of neuronx-cc processes at
    once (the fused graph is not in what `save()` writes)."""
    fused, _ = load_fused_modules()
    decoder = fused.FusedSpeculativeDecoder(
        draft.model, target.model, k=k, pad_token_id=pad_token_id, eos_token_id=eos_token_id
    )
    decoder.to_neuron(workers=compile_estimate(config).bound)
    return decoder


def prepare_runtime(config: Config, plan: DeploymentPlan) -> NeuronxApi:
    """The installed library, and what must hold before the first model touches the Neuron runtime (prepare_device),
    for a config checked for that library (resolve_models)."""
    api = load_neuronx()
    prepare_device(config, plan)
    return api


def scoring_options(api: NeuronxApi, config: Config, model_cfg: ModelConfig) -> dict[str, Any]:
    """NeuronConfig keywords of a scoring model: at batch > 1 for our loop (engine native) continuous batching, so
    a request joins a running batch with a prefill of its own slot; for the library's loop (engine library) a
    static batch with right padding, the batch it takes in one `sample` call."""
    if config.speculation.engine == "native":
        return api.continuous_batching_options(model_cfg.batch_size)
    return api.static_batch_options(model_cfg.batch_size)


def artifact_constructor(api: NeuronxApi, model_cfg: ModelConfig, options: dict[str, Any]) -> dict[str, Any]:
    """What identifies the compiled networks: the constructor arguments (batch_size among them), continuous
    batching where set (its context network is compiled at batch 1, llama/model.py lines 83-84 at 1ade6d7) and
    the padding side where set (right padding compiles 2-D cache_ids into every network, config.py:259)."""
    kwargs = api.constructor_kwargs(model_cfg)
    if "continuous_batching" in options:
        kwargs["continuous_batching"] = model_cfg.batch_size
    if "padding_side" in options:
        kwargs["padding_side"] = options["padding_side"]
    return kwargs


def prepare_device(config: Config, plan: DeploymentPlan) -> None:
    """A Neuron device is here; the plan's cores and the compile cache are set before the runtime starts
    (both libraries read them once, when the runtime starts)."""
    if not device_nodes():
        raise RuntimeProblem(
            Problem(
                "platform.backend",
                "neuron",
                "no Neuron device on this machine (no /dev/neuron*)",
                "run on an inf2 / trn1 / trn2 instance with the Neuron driver (aws-neuronx-dkms), or use "
                "platform.backend: torch; `neuron-ssp doctor` shows what this machine has",
            )
        )
    set_visible_cores(plan.visible_cores)
    if config.neuron.compile_cache_url:
        os.environ[COMPILE_CACHE_ENV] = config.neuron.compile_cache_url


def set_visible_cores(cores: str) -> None:
    """Restrict the runtime to the plan's contiguous core range; it reads this once, when it starts."""
    current = os.environ.get(VISIBLE_CORES_ENV)
    if current is not None and current != cores:
        raise UsageError(
            Problem(
                VISIBLE_CORES_ENV,
                current,
                f"the plan places the models on NeuronCores {cores}",
                f"unset {VISIBLE_CORES_ENV} (it is set from the plan) or move the models with "
                "target.first_core / draft.first_core",
            )
        )
    os.environ[VISIBLE_CORES_ENV] = cores


def compile_estimate(
    config: Config, windows: list[int] | None = None, process_bytes: int = PROCESS_BYTES
) -> CompileEstimate:
    """Networks, parallel neuronx-cc processes, host memory and time of compiling `config`'s models (the
    target with `windows`, default speculation.k) on this host."""
    placed = place_models(
        loaded_models(config), config.neuron.library, KV_PADDING, tuple(windows or (config.speculation.k,))
    )
    return estimate_compile(placed, host_memory_available(), process_bytes)


def build_model(
    api: NeuronxApi,
    model_dir: Path,
    model_cfg: ModelConfig,
    speculation_lengths: list[int] | None,
    artifacts: Path | None,
    neuron_options: dict[str, Any] | None = None,
    workers: int | None = None,
) -> Any:
    """One LlamaForSampling on the device: compiled now with at most `workers` neuronx-cc processes at
    once, or loaded from `artifacts` when given. `neuron_options`: NeuronConfig keywords."""
    options = dict(neuron_options or {})
    bound = workers if artifacts is None else None
    if bound and api.worker_count_in_config:
        options["compilation_worker_count"] = bound
    extra = {"neuron_config": api.neuron_config_class(**options)} if options and api.neuron_config_class else {}
    model = api.llama_class.from_pretrained(str(model_dir), **api.constructor_kwargs(model_cfg), **extra)
    if bound and not api.worker_count_in_config:
        bound_parallel_compile(model, bound)
    if speculation_lengths:
        api.enable_speculation(model, speculation_lengths, model_cfg.batch_size)
    if artifacts is not None:
        model.load(str(artifacts))
    model.to_neuron()
    return model


def speculation_length(config: Config, role: str) -> int | None:
    """The target is compiled for the window k; the draft decodes one token per call."""
    return config.speculation.k if role == "target" else None
