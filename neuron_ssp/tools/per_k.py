"""A ready generator for each window k.

On the torch backend one loaded target scores any width, so only the generator (drafter, acceptor,
policy) is rebuilt per k and every k can be measured on the same prompt back to back. On Neuron the
target is compiled for one k: each k needs its own compiled model (`neuron-ssp compile --k 2..10`
makes them ahead of time; they are reused here) and its own load.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from neuron_ssp.acceptors import build_acceptor
from neuron_ssp.config import Config
from neuron_ssp.generator import SpeculativeGenerator, sampling_params
from neuron_ssp.loader import Pipeline, build_drafter, load_pipeline, sampling_device
from neuron_ssp.policies import build_policy


@dataclass(frozen=True)
class KSetup:
    """What it took to get a generator for one k (zero on the torch backend)."""

    compile_s: float = 0.0
    load_s: float = 0.0
    note: str = "same loaded model for every k"


@dataclass
class KGroup:
    """Windows measured together: one loaded pipeline and a generator per k."""

    pipeline: Pipeline
    generators: dict[int, SpeculativeGenerator]
    setups: dict[int, KSetup]


def with_k(config: Config, k: int) -> Config:
    """The config with window k (k_min lowered to k when it was above)."""
    spec = config.speculation.model_copy(update={"k": k, "k_min": min(config.speculation.k_min, k)})
    return config.model_copy(update={"speculation": spec})


def generator_for_k(pipeline: Pipeline, k: int) -> SpeculativeGenerator:
    return generator_for_config(pipeline, with_k(pipeline.config, k))


def generator_for_config(pipeline: Pipeline, config: Config) -> SpeculativeGenerator:
    """A generator with `config`'s speculation and sampling settings on the pipeline's loaded models."""
    rng = torch.Generator(device=sampling_device(config))
    acceptor = build_acceptor(config.speculation.acceptor, sampling_params(config.sampling), rng)
    return SpeculativeGenerator(pipeline.target, build_drafter(config, pipeline.target, pipeline.draft, rng), acceptor,
                                build_policy(config.speculation), config.sampling, config.speculation.k, rng)


def shared_target_groups(pipeline: Pipeline, ks: list[int]) -> Iterator[KGroup]:
    """Torch: one group, every k on the already loaded model."""
    yield KGroup(pipeline, {k: generator_for_k(pipeline, k) for k in ks}, {k: KSetup() for k in ks})


def compiled_target_groups(config: Config, ks: list[int]) -> Iterator[KGroup]:
    """Neuron: per k, reuse (or make) the compiled target, load it, measure, release it."""
    for k in ks:
        config_k = with_k(config, k)
        compile_s, note = prepare_compiled(config_k)
        start = time.perf_counter()
        pipeline = load_pipeline(config_k)
        setup = KSetup(compile_s, time.perf_counter() - start, note)
        yield KGroup(pipeline, {k: pipeline.generator}, {k: setup})
        del pipeline  # the caller drops its group too: one compiled target on the device at a time
        gc.collect()


def prepare_compiled(config: Config) -> tuple[float, str]:
    """Compile the target for this k unless `neuron-ssp compile` already did; (seconds, what happened)."""
    if not config.neuron.compiled_dir:
        return 0.0, ("compiled at load: set neuron.compiled_dir and run `neuron-ssp compile CONFIG --k 2..10` "
                     "once to reuse compiled models")
    from neuron_ssp.backends.neuron_compile import compile_models
    from neuron_ssp.topology import plan_deployment

    results = compile_models(config, plan_deployment(config), [config.speculation.k])
    seconds = sum(r.seconds for r in results if not r.reused)
    if all(r.reused for r in results):
        return 0.0, f"reused compiled models in {config.neuron.compiled_dir}"
    return seconds, f"compiled in {seconds:.0f} s, kept in {config.neuron.compiled_dir}"
