"""validate_config: every problem of a config in one report, before anything compiles or loads.

Generic rules run for every backend; the hardware rules run for `platform.backend: neuron`, where
a mistake otherwise shows up minutes later as a compile error or a load failure.
"""

from __future__ import annotations

from collections.abc import Sequence

from neuron_ssp.config import Config, ModelConfig
from neuron_ssp.errors import UsageError
from neuron_ssp.topology.batch_rules import TNX_DEFAULT, check_batch
from neuron_ssp.topology.drafter_rules import check_drafter
from neuron_ssp.topology.engine_rules import check_engine
from neuron_ssp.topology.fitting import Placed
from neuron_ssp.topology.generic_rules import check_acceptor, check_positions, check_vocabulary, check_window
from neuron_ssp.topology.head_rules import check_heads, head_checkpoint_problems, installed_sdk, nxdi_head_problems
from neuron_ssp.topology.models import Architecture, resolve_architecture
from neuron_ssp.topology.neuron_rules import (
    check_instance,
    check_memory,
    check_placement,
    check_tp,
)
from neuron_ssp.topology.nxdi_rules import check_nxdi_settings
from neuron_ssp.topology.parallelism import KV_PADDING
from neuron_ssp.topology.placement import core_set, load_order, loaded_models
from neuron_ssp.topology.prefix_rules import check_prefix_cache
from neuron_ssp.topology.report import ValidationReport
from neuron_ssp.topology.vllm_neuron import check_vllm_neuron


def validate_config(
    config: Config,
    kv_rule: str = KV_PADDING,
    windows: Sequence[int] | None = None,
    neuronx_generation: str = TNX_DEFAULT,
    neuronx_installed: str | None = None,
) -> ValidationReport:
    """All errors and warnings of `config`, plus the load order its placement implies, for the
    transformers-neuronx version's `kv_rule` and generation (batch_rules: 0.13 by default, what the SDK 2.25 DLAMI
    installs; the loader passes the generation the installed build behaves as, and `neuronx_installed`, its words
    for that build) and a target compiled for `windows` (default: speculation.k)."""
    report = ValidationReport()
    models = loaded_models(config)
    on_neuron = config.platform.backend == "neuron"
    architectures = _resolve(models, report, required=on_neuron)
    report.load_order = load_order({role: core_set(model) for role, model in models.items()})

    check_window(config, models, report)
    check_positions(config, models, report)
    check_vocabulary(architectures, models.get("draft"), report)
    check_drafter(config, report)
    check_engine(config, models, architectures, report)
    check_acceptor(config, report)
    check_nxdi_settings(config, models, report)
    check_prefix_cache(config, report)
    if on_neuron:
        _check_neuron(
            config,
            models,
            architectures,
            report,
            kv_rule,
            tuple(windows or (config.speculation.k,)),
            neuronx_generation,
            neuronx_installed,
        )
    return report


def _check_neuron(
    config: Config,
    models: dict[str, ModelConfig],
    architectures: dict[str, Architecture],
    report: ValidationReport,
    kv_rule: str,
    windows: tuple[int, ...],
    neuronx_generation: str,
    neuronx_installed: str | None,
) -> None:
    check_batch(config, models, report, neuronx_generation, neuronx_installed)
    check_vllm_neuron(config, models, report)
    report.errors.extend(nxdi_head_problems(config))
    instance = check_instance(config.platform.instance_type, report, config.neuron.library)
    check_heads(config, report, installed_sdk(config.neuron.library, instance.generation if instance else None))
    target = architectures.get("target")
    report.errors.extend(head_checkpoint_problems(config, target.layers if target else None))
    if instance is None:
        return
    for role, model in models.items():
        check_tp(role, model, architectures.get(role), instance, report)
    if len(architectures) == len(models):
        placed = {
            role: Placed(
                model, architectures[role], config.neuron.library, kv_rule, windows if role == "target" else ()
            )
            for role, model in models.items()
        }
        check_memory(placed, instance, report)
    check_placement(models, instance, report, config.neuron.library)


def _resolve(models: dict[str, ModelConfig], report: ValidationReport, required: bool) -> dict[str, Architecture]:
    """Architectures that can be told. An unknown one is an error on Neuron (memory and tp rules need
    it) or when an `architecture:` hint names nothing; on torch it is skipped, as that backend reads
    the model's own config when it loads."""
    architectures: dict[str, Architecture] = {}
    for role, model in models.items():
        try:
            architectures[role] = resolve_architecture(model, role)
        except UsageError as exc:
            if required or model.architecture is not None:
                report.errors.extend(exc.problems)
    return architectures
