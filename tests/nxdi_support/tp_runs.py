"""What each rank runs for tests/test_nxdi_shipped_tp2.py: the scaled copy of a shipped config built by our NxDI
backend (backends/nxdi/load.py: the NeuronConfigs, the fused application) and run through NxDI's CPU mode.

- engine fused (a draft model or an EAGLE-3 head): context encoding, then fused decoding calls through our loop
  (engines/nxdi_fused.py) until `new_tokens` are committed; the tokens come back.
- engine native: the target's context encoding and one k-wide window, the draft's context encoding and one
  one-token call, as our loop makes them (backends/nxdi/scoring.py); the logits come back.
A config that fails comes back as its traceback, so the other configs still run: every rank runs the same
calls, so every rank fails at the same place.
"""

from __future__ import annotations

import traceback
from typing import Any

import torch

from nxdi_support.scaled import ScaledCase


def run_cases(cases: list[ScaledCase], prompt: list[int], new_tokens: int) -> dict[str, Any]:
    """Each case's result (or its traceback), by config name."""
    from nxdi_support import patches

    results: dict[str, Any] = {}
    for case in cases:
        try:
            with patches.cpu_device():
                results[case.name] = run_case(case, torch.tensor(prompt), new_tokens)
        except Exception:  # noqa: BLE001 - reported per config by the test
            results[case.name] = traceback.format_exc()
    return results


def run_case(case: ScaledCase, prompt: torch.Tensor, new_tokens: int) -> dict[str, Any]:
    from neuron_ssp.backends.neuron.on_device import OnDeviceBackend
    from neuron_ssp.backends.nxdi.api import load_nxdi
    from neuron_ssp.backends.nxdi.load import NxdiModels, fused_application, vocab_size
    from neuron_ssp.backends.nxdi.scoring import NxdiBackend
    from neuron_ssp.backends.resolve import model_config, resolve_models
    from neuron_ssp.engines.nxdi_fused import NxdiFusedEngine
    from neuron_ssp.topology import plan_deployment
    from nxdi_support.ranks import to_cpu_on_rank

    config = case.config()
    plan = plan_deployment(config)
    models = NxdiModels(config, plan, load_nxdi(plan.instance.generation), resolve_models(config))
    k = config.speculation.k
    if config.speculation.engine == "fused":
        app, _ = fused_application(models)
        to_cpu_on_rank(app)
        target = OnDeviceBackend(app, "target", vocab_size(app), config.target.n_positions, case.target)
        return {"tokens": NxdiFusedEngine(target, k).generate(prompt, new_tokens).tokens}
    logits = {}
    for role in plan.load_order:
        width = k if role == "target" else 0
        app, _ = models.application(role, width)
        to_cpu_on_rank(app)
        backend = NxdiBackend(app, role, vocab_size(app), model_config(config, role).n_positions, width or None)
        window = torch.arange(3, 3 + (width or 1))
        logits[role] = torch.cat([backend.prefill(prompt).view(1, -1), backend.score(window, len(prompt))])
    return {"logits": logits}
