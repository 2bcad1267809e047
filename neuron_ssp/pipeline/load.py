"""Config -> ready pipeline: validate first, then load models, drafter, acceptor and policy.

Nothing loads from an invalid config: topology, placement and memory are checked before any weight
is read (on Neuron, before paying for a compile).
"""

from __future__ import annotations

import torch
from transformers import AutoTokenizer
from transformers.utils import logging as transformers_logging

from neuron_ssp.backends.base import ModelBackend
from neuron_ssp.config import Config
from neuron_ssp.embedded.models import resolve_model_path
from neuron_ssp.engines.native import sampling_params
from neuron_ssp.pipeline.build import build_generator, sampling_device
from neuron_ssp.pipeline.pipeline import Pipeline
from neuron_ssp.pipeline.prompts import stop_token_ids
from neuron_ssp.speculation.acceptors import build_acceptor
from neuron_ssp.topology import DeploymentPlan, validate_config


def load_pipeline(config: Config) -> Pipeline:
    validate_config(config).raise_if_invalid()
    rng = torch.Generator(device=sampling_device(config))  # draws where the logits are (CUDA: no copies)
    acceptor = build_acceptor(config.speculation.acceptor, sampling_params(config.sampling), rng)  # fail fast
    transformers_logging.disable_progress_bar()
    if config.platform.backend == "neuron":
        from neuron_ssp.topology import plan_deployment

        target, draft = load_neuron_models(config, plan_deployment(config))
        tokenizer = AutoTokenizer.from_pretrained(str(resolve_model_path(config.target.path, "target.path")))
    else:
        from neuron_ssp.backends.torch.load import load_torch_backends

        target, draft, tokenizer = load_torch_backends(config)
    generation_config = getattr(getattr(target, "model", None), "generation_config", None)
    eos = stop_token_ids(tokenizer, config.generation.stop_tokens, getattr(generation_config, "eos_token_id", None))
    return Pipeline(config, tokenizer, target, draft, build_generator(config, target, draft, acceptor, rng), eos)


def load_neuron_models(config: Config, plan: DeploymentPlan) -> tuple[ModelBackend, ModelBackend | None]:
    """(target, draft) through the library `neuron.library` names; engine fused gets on-device models."""
    if config.neuron.library == "nxdi":
        from neuron_ssp.backends.nxdi.load import load_nxdi_backends, load_nxdi_fused

        fused = config.speculation.engine == "fused"
        return load_nxdi_fused(config, plan) if fused else load_nxdi_backends(config, plan)
    from neuron_ssp.backends.neuron.load import load_neuron_backends

    return load_neuron_backends(config, plan)
