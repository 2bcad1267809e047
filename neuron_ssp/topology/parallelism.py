"""Which tensor-parallel degrees each Neuron platform accepts, and which AWS has tested.

The compiler rejects (or the runtime fails to load) a tp degree the chip topology cannot map;
degrees that are allowed but outside the tested set may work but are off the beaten path.
"""

from __future__ import annotations

import math

from neuron_ssp.topology.catalog import Generation

# Neuron docs: the tp degrees tested for transformers-neuronx on each platform.
TESTED_TP: dict[str, tuple[int, ...]] = {"trn1": (1, 2, 8, 16, 32), "inf2": (1, 2, 4, 8, 12, 24)}

TP_RULE: dict[str, str] = {
    "trn1": "Trn1 accepts tp_degree 1, 2, 8, 16 or a multiple of 32",
    "inf2": "Inf2 accepts tp_degree 1 or a multiple of 2",
}


def tp_allowed(generation: Generation, tp_degree: int) -> bool:
    """The seed blog's rule: Trn1 1, 2, 8, 16 or a multiple of 32; Inf2 1 or a multiple of 2."""
    if generation == "trn1":
        return tp_degree in (1, 2, 8, 16) or tp_degree % 32 == 0
    if generation == "inf2":
        return tp_degree == 1 or tp_degree % 2 == 0
    return False  # trn2: transformers-neuronx does not run there, so no degree is accepted


def tp_tested(generation: Generation, tp_degree: int) -> bool:
    return tp_degree in TESTED_TP.get(generation, ())


def allowed_tp_degrees(generation: Generation, cores: int) -> list[int]:
    """Every tp degree the platform accepts that fits in `cores` cores, smallest first."""
    return [tp for tp in range(1, cores + 1) if tp_allowed(generation, tp)]


def nearest_allowed(generation: Generation, tp_degree: int, cores: int) -> list[int]:
    """The allowed degrees just below and just above `tp_degree` (within the instance)."""
    allowed = allowed_tp_degrees(generation, cores)
    below = [tp for tp in allowed if tp < tp_degree][-1:]
    above = [tp for tp in allowed if tp > tp_degree][:1]
    return below + above


def padded_heads(heads: int, tp_degree: int) -> int:
    """Heads after transformers-neuronx pads them to a multiple of tp (equal to `heads` if none)."""
    return math.ceil(heads / tp_degree) * tp_degree
