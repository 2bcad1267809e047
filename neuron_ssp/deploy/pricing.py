"""$/h for the cost lines of launch, list and teardown, from the topology catalog.

These are on-demand estimates for us-east-1: other regions differ, and Capacity Blocks are paid up
front at their own price.
"""

from __future__ import annotations

from neuron_ssp.topology import hourly_price_usd


def hourly_usd(instance_type: str) -> float | None:
    """On-demand $/h of the type, or None when the catalog does not know it."""
    return hourly_price_usd(instance_type)


def format_usd(amount: float | None) -> str:
    return "unknown" if amount is None else f"${amount:,.2f}"
