"""Compile the config's models once, every candidate k in one target, and keep them in an artifact store.

A compile of a 70B target takes many minutes, so `neuron-ssp compile --k 2..8` builds ONE target with
`enable_speculative_decoder([2, ..., 8])` (a scoring network per k, the weights loaded once) and one
draft; loading reuses them and picks k at run time, so `tune-k` loads once and sweeps. Only a library
build whose `enable_speculative_decoder` takes a single k gets one target per k (detected from its
signature, see api.py). neuronx-cc's own cache (NEURON_COMPILE_CACHE_URL) still makes a repeated
compile of the same graph fast. Before the first compile the device memory is checked with the networks
of every k, and the neuronx-cc processes that run at once are bounded by the host's free memory
(topology/compile_plan.py: the estimate and its basis, printed by `neuron-ssp compile`).
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass

from neuron_ssp.backends.neuron.artifacts import ArtifactStore, artifact_spec
from neuron_ssp.backends.neuron.load import (
    artifact_constructor,
    build_model,
    compile_estimate,
    prepare_runtime,
    scoring_options,
)
from neuron_ssp.backends.resolve import model_config, resolve_models
from neuron_ssp.config import Config
from neuron_ssp.errors import Problem, UsageError
from neuron_ssp.topology import DeploymentPlan
from neuron_ssp.topology.compile_plan import PROCESS_BYTES


@dataclass(frozen=True)
class CompileJob:
    role: str
    speculation_lengths: tuple[int, ...] | None  # None: the draft, which decodes one token per call

    @property
    def label(self) -> str:
        if not self.speculation_lengths:
            return f"{self.role} (no speculation)"
        return f"{self.role} k={','.join(str(k) for k in self.speculation_lengths)}"


@dataclass(frozen=True)
class CompileResult:
    job: CompileJob
    location: str
    seconds: float
    reused: bool  # already compiled with a matching manifest: nothing was done


def compile_jobs(plan: DeploymentPlan, ks: list[int], one_k_per_model: bool = False) -> list[CompileJob]:
    """The draft once (its networks do not depend on k), the target once for every k (or once per k
    where the library needs it), in the plan's load order."""
    windows = sorted(set(ks))
    jobs: list[CompileJob] = []
    for role in plan.load_order:
        if role != "target":
            jobs.append(CompileJob(role, None))
        elif one_k_per_model:
            jobs += [CompileJob("target", (k,)) for k in windows]
        else:
            jobs.append(CompileJob("target", tuple(windows)))
    return jobs


class Compiler:
    """Checks everything before the first compile (so errors come before a progress bar), then runs jobs."""

    def __init__(
        self,
        config: Config,
        plan: DeploymentPlan,
        ks: list[int],
        force: bool = False,
        process_bytes: int = PROCESS_BYTES,
    ):
        if config.speculation.engine == "fused":
            raise UsageError(
                Problem(
                    "speculation.engine",
                    "fused",
                    "the fused decoder compiles its own graph at every load; save() does not keep it",
                    "load the config directly (generate, serve), or compile for engine native / library",
                )
            )
        if not config.neuron.compiled_dir:
            raise UsageError(
                Problem(
                    "neuron.compiled_dir",
                    None,
                    "compile needs a place to keep the compiled models",
                    "set neuron.compiled_dir (a directory or s3://bucket/prefix) or pass --out DIR",
                )
            )
        self.config = config
        self.force = force
        self.dirs = resolve_models(config, ks)  # device memory with the networks of every k
        self.api = prepare_runtime(config, plan)
        self.store = ArtifactStore(config.neuron.compiled_dir)
        self.jobs = compile_jobs(plan, ks, one_k_per_model=not self.api.speculation_takes_k_list)
        self.estimate = compile_estimate(config, ks if self.api.speculation_takes_k_list else None, process_bytes)

    def run(self, job: CompileJob) -> CompileResult:
        model_cfg = model_config(self.config, job.role)
        model_dir = self.dirs.of(job.role)
        windows = list(job.speculation_lengths) if job.speculation_lengths else None
        options = scoring_options(self.api, self.config, model_cfg)
        spec = artifact_spec(
            job.role,
            model_dir,
            artifact_constructor(self.api, model_cfg, options),
            windows,
            self.api.version,
            one_k_per_model=not self.api.speculation_takes_k_list,
        )
        if not self.force and self.store.find(spec):
            return CompileResult(job, self.store.describe(spec), 0.0, reused=True)
        start = time.perf_counter()
        model = build_model(self.api, model_dir, model_cfg, windows, None, options, self.estimate.bound)
        model.save(str(self.store.staging_dir(spec)))
        seconds = time.perf_counter() - start
        del model
        gc.collect()  # release the device memory before the next compile loads another copy
        return CompileResult(job, self.store.publish(spec, seconds), seconds, reused=False)


def compile_models(config: Config, plan: DeploymentPlan, ks: list[int], force: bool = False) -> list[CompileResult]:
    """Compile every job of `config` for the windows `ks` (the programmatic form of `neuron-ssp compile`)."""
    compiler = Compiler(config, plan, ks, force)
    return [compiler.run(job) for job in compiler.jobs]
