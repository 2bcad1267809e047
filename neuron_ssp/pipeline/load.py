"""Config -> ready pipeline: validate first, then load models, drafter, acceptor and policy.

Nothing loads from an invalid config: topology, placement and memory are checked before any weight
is read (on Neuron, before paying for a compile).
"""

from __future__ import annotations

from typing import Any

from transformers import AutoTokenizer, PreTrainedTokenizerBase
from transformers.utils import logging as transformers_logging

from neuron_ssp.backends.base import ModelBackend
from neuron_ssp.backends.checkpoint import checkpoint_eos_ids
from neuron_ssp.backends.resolve import ModelDirs, resolve_models
from neuron_ssp.config import Config
from neuron_ssp.drafters.combined import LookupOrHead
from neuron_ssp.drafters.eagle import EagleDrafter
from neuron_ssp.drafters.head_answer import check_head_answer
from neuron_ssp.embedded.heads import EMBEDDED_HEADS
from neuron_ssp.pipeline.build import Shared, build_generator, share
from neuron_ssp.pipeline.pipeline import Pipeline
from neuron_ssp.pipeline.prompts import stop_token_ids
from neuron_ssp.speculation.acceptors import acceptor_class
from neuron_ssp.topology import DeploymentPlan


def load_pipeline(config: Config, max_batch: int = 1) -> Pipeline:
    """`max_batch`: requests the pipeline runs at once (the server's serve.max_batch): the target's KV cache
    holds that many sequences, and the cost policy times calls of up to max_batch x k rows."""
    acceptor_class(config.speculation.acceptor)  # a plug-in that does not import fails before any weight loads
    dirs = resolve_models(config)  # checked once, each model's directory found once
    transformers_logging.disable_progress_bar()
    if config.platform.backend == "neuron":
        from neuron_ssp.topology import plan_deployment

        target, draft = load_neuron_models(config, plan_deployment(config), dirs)
        tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(str(dirs.target))
    else:
        from neuron_ssp.backends.torch.load import load_torch_backends

        target, draft, tokenizer = load_torch_backends(config, max_batch, dirs)
    # extra EOS ids from the checkpoint's directory, for every backend: a Neuron model has no generation_config
    eos = stop_token_ids(tokenizer, config.generation.stop_tokens, checkpoint_eos_ids(dirs.target))
    shared = share(config, target, draft, max_batch * config.speculation.k if max_batch > 1 else None)
    check_if_embedded_head(config, shared, target, tokenizer)
    generator = build_generator(config, target, draft, shared)
    return Pipeline(config, tokenizer, target, draft, generator, eos, shared, max_batch)


def check_if_embedded_head(config: Config, shared: Shared, target: ModelBackend, tokenizer: Any) -> None:
    """The shipped EAGLE-3 head's known answer, as the embedded model's is checked at every load."""
    head = shared.drafter.head if isinstance(shared.drafter, LookupOrHead) else shared.drafter
    if isinstance(head, EagleDrafter) and config.draft is not None and config.draft.path in EMBEDDED_HEADS:
        check_head_answer(head.model, target, tokenizer, config.draft.path)  # type: ignore[arg-type]


def load_neuron_models(
    config: Config, plan: DeploymentPlan, dirs: ModelDirs | None = None
) -> tuple[ModelBackend, ModelBackend | None]:
    """(target, draft) through the library `neuron.library` names; engine fused gets on-device models."""
    if config.neuron.library == "nxdi":
        from neuron_ssp.backends.nxdi.load import load_nxdi_backends, load_nxdi_fused

        fused = config.speculation.engine == "fused"
        return load_nxdi_fused(config, plan, dirs) if fused else load_nxdi_backends(config, plan, dirs)
    from neuron_ssp.backends.neuron.load import load_neuron_backends

    return load_neuron_backends(config, plan, dirs)
