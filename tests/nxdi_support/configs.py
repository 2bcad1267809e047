"""Configs for the tiny models on the NxDI backend."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from neuron_support import neuron_config


def nxdi_config(target: Path, draft: Path | None = None, /, **sections: Any) -> Any:
    """A valid NxDI config for the tiny models on a trn1.32xlarge: tp 1 (CPU mode runs one rank), fp32."""
    for role in ("target", "draft"):
        sections[role] = {"tp_degree": 1, **sections.get(role, {})}
    sections["neuron"] = {"library": "nxdi", **sections.get("neuron", {})}
    if draft is None:
        sections.pop("draft")
    return neuron_config(target, draft, **sections)
