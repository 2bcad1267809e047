"""A ready generator for each window k.

On the torch backend one loaded target scores any width, so only the generator (drafter, acceptor,
policy) is rebuilt per k and every k can be measured on the same prompt back to back. On Neuron one
compiled target holds a scoring network per k (`neuron-ssp compile --k 2..10`, or compiled here once):
it is loaded once and each k's generator scores through `target.with_window(k)`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

from neuron_ssp.config import Config
from neuron_ssp.engines.native import SpeculativeGenerator
from neuron_ssp.errors import Problem, UsageError
from neuron_ssp.pipeline.build import build_generator, share
from neuron_ssp.pipeline.load import load_pipeline
from neuron_ssp.pipeline.pipeline import Pipeline


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
    """Our loop with `config`'s speculation and sampling settings on the pipeline's loaded models."""
    with_window = getattr(pipeline.target, "with_window", None)  # Neuron: the network compiled for this k
    target = with_window(config.speculation.k) if with_window is not None else pipeline.target
    native = config.model_copy(update={"speculation": config.speculation.model_copy(update={"engine": "native"})})
    generator = build_generator(native, target, pipeline.draft, share(native, target, pipeline.draft))
    assert isinstance(generator, SpeculativeGenerator)
    return generator


def shared_target_groups(pipeline: Pipeline, ks: list[int]) -> Iterator[KGroup]:
    """Torch: one group, every k on the already loaded model."""
    yield KGroup(pipeline, {k: generator_for_k(pipeline, k) for k in ks}, {k: KSetup() for k in ks})


def compiled_target_groups(config: Config, ks: list[int]) -> Iterator[KGroup]:
    """Neuron: one target compiled with every k (reused when `neuron-ssp compile` made it), loaded once;
    NxD Inference compiles one speculation width per target, so there each k is its own group, loaded in turn."""
    if config.neuron.library == "nxdi":
        yield from per_k_targets(config, ks)
        return
    widest = with_k(config, max(ks))
    compile_s, note = prepare_compiled(widest, ks)
    start = time.perf_counter()
    pipeline = load_pipeline(widest)
    setup = KSetup(compile_s, time.perf_counter() - start, note)
    yield KGroup(pipeline, {k: generator_for_k(pipeline, k) for k in ks}, {k: setup for k in ks})


def prepare_compiled(config: Config, ks: list[int]) -> tuple[float, str]:
    """Compile one target holding every k unless `neuron-ssp compile` already did; (seconds, what happened)."""
    if not config.neuron.compiled_dir:
        raise UsageError(
            Problem(
                "neuron.compiled_dir",
                None,
                "tune-k on Neuron compiles every k into one target and keeps it",
                "set neuron.compiled_dir (a directory or s3://bucket/prefix), or run `neuron-ssp compile CONFIG "
                f"--k {min(ks)}..{max(ks)} --out DIR` first",
            )
        )
    from neuron_ssp.backends.neuron.compile import compile_models
    from neuron_ssp.topology import plan_deployment

    results = compile_models(config, plan_deployment(config), ks)
    seconds = sum(r.seconds for r in results if not r.reused)
    if all(r.reused for r in results):
        return 0.0, f"reused the target compiled for k={ks} in {config.neuron.compiled_dir}"
    return seconds, f"compiled k={ks} into one target in {seconds:.0f} s, kept in {config.neuron.compiled_dir}"


def per_k_targets(config: Config, ks: list[int]) -> Iterator[KGroup]:
    """NxD Inference: the target compiled for each k (reused when `neuron-ssp compile --k` made it), loaded
    one after the other; plain decoding on it pads every token to k, as every call of such a target does."""
    for k in ks:
        start = time.perf_counter()
        pipeline = load_pipeline(with_k(config, k))
        note = (
            f"NxD Inference target for k={k} alone, compiled unless kept in "
            f"{config.neuron.compiled_dir or 'the local cache'} (load time includes it); plain decoding on it "
            f"runs {k}-wide calls"
        )
        yield KGroup(pipeline, {k: generator_for_k(pipeline, k)}, {k: KSetup(0.0, time.perf_counter() - start, note)})
