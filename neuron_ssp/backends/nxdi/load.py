"""Compile and load the models through NxD Inference, in the plan's order, with our artifact manifest.

NxDI's flow (feature guide, "Speculative Decoding with a Draft model"; application_base.py:292, 318 at
4bcdc54b): build `NeuronLlamaForCausalLM(model_dir, config)`, `compile(dir)` (traces every sub-model and writes
`model.pt` + `neuron_config.json`), `load(dir, start_rank_id, local_ranks_size)` (NEFFs to the device, weights
sharded from the checkpoint). Placement is NEURON_RT_VISIBLE_CORES (the plan's range, set before the first
load): every model of the process starts at its first core. `start_rank_id` is no core offset but the
tensor-parallel rank a node starts at in a multi-node run (inference_demo.py:795, `node_rank *
local_ranks_size`); the weights are sharded for the ranks from `neuron_config.start_rank_id`
(application_base.py:156-163, NxD model_builder.py:852), so it stays 0 here and validate refuses a draft
that would need another first core (topology/neuron_rules.py).

A compiled directory holds ONE speculation width (speculation_length is one int), so the target is compiled
once per k; the draft (speculation_length 0) once for all. Each directory carries our manifest (k, tp, dtype,
library version, NxDI config digest) and is reused only when it matches; without `neuron.compiled_dir` the
compiled models are kept in the local cache, since NxDI loads only from disk.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from neuron_ssp.backends.neuron.artifacts import LOCAL_CACHE, ArtifactSpec, ArtifactStore, artifact_spec
from neuron_ssp.backends.neuron.load import prepare_device
from neuron_ssp.backends.nxdi.api import (
    EAGLE_HEAD_AFTER_BUILD,
    LNC,
    NxdiApi,
    continuous_batching,
    eagle_head,
    eagle_switches,
    load_nxdi,
)
from neuron_ssp.backends.nxdi.scoring import NxdiBackend
from neuron_ssp.backends.resolve import ModelDirs, model_config, resolve_models
from neuron_ssp.config import Config
from neuron_ssp.topology import DeploymentPlan


def prepare_nxdi(config: Config, plan: DeploymentPlan) -> NxdiApi:
    """The installed NxDI and the visible cores, for a config its caller validated."""
    api = load_nxdi(plan.instance.generation)
    prepare_device(config, plan)
    return api


def artifact_store(config: Config) -> ArtifactStore:
    return ArtifactStore(config.neuron.compiled_dir or str(LOCAL_CACHE / "nxdi"))


class NxdiModels:
    """Builds, compiles (once) and loads the NxDI applications of one config, from the checked models in `dirs`
    (checked and resolved here when not given)."""

    def __init__(self, config: Config, plan: DeploymentPlan, api: NxdiApi, dirs: ModelDirs | None = None):
        self.config = config
        self.plan = plan
        self.api = api
        self.dirs = dirs or resolve_models(config)
        self.store = artifact_store(config)
        self.lnc = LNC.get(plan.instance.generation, 1)

    def application(self, role: str, speculation_length: int) -> tuple[Any, ArtifactSpec]:
        """The NxDI application for `role` and the artifact spec its compiled form is kept under."""
        kwargs = self.api.neuron_config_kwargs(self.config, role, speculation_length, lnc=self.lnc)
        model_dir = self.dirs.of(role)
        neuron_config = self.api.neuron_config(kwargs)
        app = self.api.application(model_dir, self.api.inference_config(model_dir, neuron_config))
        return app, self.spec(role, model_dir, kwargs, neuron_config, speculation_length)

    def spec(
        self, role: str, model_dir: Path, kwargs: dict[str, Any], neuron_config: Any, speculation_length: int
    ) -> ArtifactSpec:
        identity = {**kwargs, "nxdi_config_sha256": self.api.config_sha256(neuron_config)}
        return artifact_spec(
            role,
            model_dir,
            identity,
            [speculation_length] if speculation_length else None,
            f"neuronx-distributed-inference {self.api.version}",
            one_k_per_model=True,
        )

    def compiled(self, app: Any, spec: ArtifactSpec, force: bool = False) -> tuple[Path, float | None]:
        """The compiled directory for `spec`: reused when its manifest matches, else compiled now
        (seconds spent, None when reused)."""
        found = None if force else self.store.find(spec)
        if found is not None:
            return found, None
        import time

        target = self.store.staging_dir(spec)
        start = time.perf_counter()
        app.compile(str(target))
        seconds = time.perf_counter() - start
        self.store.publish(spec, seconds)
        return target, seconds

    def load(self, role: str, app: Any, directory: Path) -> None:
        """NEFFs and weights onto the first `tp_degree` visible cores: ranks 0.. of a one-node model."""
        app.load(str(directory), start_rank_id=0, local_ranks_size=model_config(self.config, role).tp_degree)


def load_nxdi_backends(
    config: Config, plan: DeploymentPlan, dirs: ModelDirs | None = None
) -> tuple[NxdiBackend, NxdiBackend | None]:
    """(target, draft) on Neuron through NxDI; the draft is None unless `speculation.drafter` is 'model'. `dirs`:
    the pipeline's checked models (checked and resolved here when not given)."""
    dirs = dirs or resolve_models(config)
    api = prepare_nxdi(config, plan)
    models = NxdiModels(config, plan, api, dirs)
    backends: dict[str, NxdiBackend] = {}
    for role in plan.load_order:
        k = config.speculation.k if role == "target" else 0
        app, spec = models.application(role, k)
        directory, _ = models.compiled(app, spec)
        models.load(role, app, directory)
        backends[role] = NxdiBackend(app, role, vocab_size(app), model_config(config, role).n_positions, k or None)
    if config.neuron.self_test:
        from neuron_ssp.backends.neuron.selftest import NXDI, check_self_test, self_test

        check_self_test(self_test(backends["target"], config, f"{NXDI} {api.version}", dirs.target))
    return backends["target"], backends.get("draft")


def load_nxdi_fused(config: Config, plan: DeploymentPlan, dirs: ModelDirs | None = None) -> tuple[Any, None]:
    """engine fused: ONE application holding draft and target (`enable_fused_speculation` with a
    `FusedSpecNeuronConfig`, feature guide "Fused Speculation"); it returns token ids, not logits, so the
    backend refuses to score (plain decoding needs engine native)."""
    from neuron_ssp.backends.neuron.on_device import OnDeviceBackend

    dirs = dirs or resolve_models(config)
    models = NxdiModels(config, plan, prepare_nxdi(config, plan), dirs)
    app, spec = fused_application(models)
    directory, _ = models.compiled(app, spec)
    models.load("target", app, directory)
    return OnDeviceBackend(app, "target", vocab_size(app), config.target.n_positions, dirs.target), None


def fused_application(models: NxdiModels) -> tuple[Any, ArtifactSpec]:
    """The fused NxDI application and its artifact spec. Greedy on device: NeuronFusedSpecModel asserts an
    on-device sampling config (model_base.py:1765) and forces the draft greedy (model_base.py:1635). A target
    batch_size above 1 builds both models for continuous batching (api.continuous_batching). With an EAGLE head
    (drafter eagle / eagle3) target and head carry the EAGLE switches (api.eagle_switches, api.eagle_head)."""
    api, config, greedy = models.api, models.config, {"do_sample": False, "top_k": 1}
    k, batch = config.speculation.k, continuous_batching(config.target.batch_size)
    head = eagle_switches(config.speculation.drafter)
    target_kwargs = {**api.neuron_config_kwargs(config, "target", k, fused=True, lnc=models.lnc), **batch, **head}
    draft = {**head, **eagle_head(target_kwargs)} if head else {}
    draft_kwargs = {**api.neuron_config_kwargs(config, "draft", k if head else 0, lnc=models.lnc), **batch, **draft}
    draft_dir, target_dir = models.dirs.of("draft"), models.dirs.target
    after_build = EAGLE_HEAD_AFTER_BUILD if head else None
    draft_config = api.inference_config(draft_dir, api.neuron_config(draft_kwargs, greedy, after_build))
    neuron_config = api.neuron_config(target_kwargs, greedy)
    inference_config = api.inference_config(target_dir, neuron_config)
    inference_config.fused_spec_config = api.fused_spec_config(draft_dir, draft_config)
    app = api.application(target_dir, inference_config)
    identity = {**target_kwargs, "draft": draft_kwargs, "draft_config_sha256": api.config_sha256(draft_config)}
    return app, models.spec("target", target_dir, identity, neuron_config, k)


def vocab_size(app: Any) -> int:
    return int(app.config.vocab_size)
