"""neuron-ssp: speculative sampling for Llama models on AWS Inferentia2 / Trainium, with a PyTorch
reference backend.

The package by job, top to bottom (arrows point down):
- cli/, serve/: the `neuron-ssp` command line and the OpenAI-compatible server;
- tools/: tune-k, bench, eval ... built on a pipeline, never imported by it;
- deploy/: EC2 instances and SageMaker endpoints through boto3;
- pipeline/: config -> loaded pipeline (prompts, engine factories, text streaming);
- engines/: the loops that generate: ours (native) and transformers-neuronx's (library, fused);
- backends/: score tokens at cache positions (torch, neuron); drafters/: propose tokens;
- speculation/: the loop's swappable pieces (acceptors, window policies) and what it measures;
- topology/: instance catalog, tp rules, placement and memory plans (pure logic);
- embedded/: the embedded default model (conversion, cache, known-answer checks);
- config, errors: the typed config and user-facing errors every layer reads.

The names below are the public API, imported on first use so that `neuron-ssp validate` and the
other torch-free commands start fast.
"""

from __future__ import annotations

import importlib
from typing import Any

_PUBLIC = {
    "Config": "neuron_ssp.config",
    "load_config": "neuron_ssp.config",
    "Pipeline": "neuron_ssp.pipeline.pipeline",
    "load_pipeline": "neuron_ssp.pipeline.load",
    "build_generator": "neuron_ssp.pipeline.build",
    "SpeculativeGenerator": "neuron_ssp.engines.native",
    "plain_generate": "neuron_ssp.engines.native",
    "GenerationResult": "neuron_ssp.engines.base",
    "TokenAcceptor": "neuron_ssp.speculation.acceptors",
    "ProbabilisticAcceptor": "neuron_ssp.speculation.acceptors",
    "GreedyAcceptor": "neuron_ssp.speculation.acceptors",
    "TypicalAcceptor": "neuron_ssp.speculation.acceptors",
    "build_policy": "neuron_ssp.speculation.policies",
    "GenerationStats": "neuron_ssp.speculation.stats",
    "Drafter": "neuron_ssp.drafters",
    "NgramDrafter": "neuron_ssp.drafters",
    "SuffixDrafter": "neuron_ssp.drafters",
    "ModelDrafter": "neuron_ssp.drafters",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'neuron_ssp' has no attribute {name!r}")
    return getattr(importlib.import_module(_PUBLIC[name]), name)


def __dir__() -> list[str]:
    return __all__
