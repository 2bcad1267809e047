"""`neuron-ssp compile` on NxD Inference: the draft once, the target once per k (NxDI compiles one speculation
width per target), each kept with our manifest; loading and tune-k reuse them (backends/nxdi/load.py)."""

from __future__ import annotations

from neuron_ssp.backends.neuron.compile import CompileJob, CompileResult, compile_jobs
from neuron_ssp.backends.nxdi.load import NxdiModels, fused_application, prepare_nxdi
from neuron_ssp.backends.resolve import model_config, resolve_models
from neuron_ssp.config import Config
from neuron_ssp.errors import Problem, UsageError
from neuron_ssp.topology import DeploymentPlan
from neuron_ssp.topology.nxdi_graphs import nxdi_graphs


class NxdiCompiler:
    """Same jobs and results as the transformers-neuronx Compiler, through NxDI's compile(dir)."""

    def __init__(self, config: Config, plan: DeploymentPlan, ks: list[int], force: bool = False):
        if config.speculation.engine == "fused" and len(set(ks)) > 1:
            raise UsageError(
                Problem(
                    "--k",
                    ks,
                    "NxDI fused speculation compiles draft and target into one graph per k; compile one k at a time",
                    "pass one k, e.g. --k 5",
                )
            )
        self.models = NxdiModels(config, plan, prepare_nxdi(config, plan), resolve_models(config))
        self.force = force
        self.fused = config.speculation.engine == "fused"
        self.jobs = [CompileJob("target", tuple(ks))] if self.fused else compile_jobs(plan, ks, one_k_per_model=True)

    def graph_counts(self) -> dict[str, int]:
        """Graphs NxDI traces per job: one per context-encoding and decoding bucket (topology/nxdi_graphs.py)."""
        config = self.models.config
        return {job.label: nxdi_graphs(config, job.role, model_config(config, job.role)).total for job in self.jobs}

    def lines(self) -> list[str]:
        counts = self.graph_counts()
        per_job = ", ".join(f"{label}: {count}" for label, count in counts.items())
        return [
            f"graphs to compile: {sum(counts.values())} ({per_job}), one per context-encoding and decoding "
            "bucket; `neuron-ssp plan` lists the buckets"
        ]

    def run(self, job: CompileJob) -> CompileResult:
        k = job.speculation_lengths[0] if job.speculation_lengths else 0
        app, spec = fused_application(self.models) if self.fused else self.models.application(job.role, k)
        directory, seconds = self.models.compiled(app, spec, self.force)
        return CompileResult(job, self.models.store.describe(spec), seconds or 0.0, reused=seconds is None)
