"""What the tests see of NxDI's calls."""

from __future__ import annotations

from typing import Any


def recorded_forward(app: Any) -> list[dict[str, list]]:
    """Wrap an NxDI application so every forward call's inputs are kept."""
    calls: list[dict[str, list]] = []
    real = app.forward

    def forward(**inputs: Any) -> Any:
        calls.append({name: value.tolist() for name, value in inputs.items()})
        return real(**inputs)

    app.forward = forward
    return calls
