"""`neuron-ssp plan --engine`: the projected ms/token and speedup table, each figure next to its assumption."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from neuron_ssp.topology.projection import Projection


def print_projection(console: Console, projection: Projection) -> None:
    table = Table(title=f"projection: engine {projection.engine}, k={projection.k} (no hardware; assumptions "
                  "beside each figure)", title_justify="left")
    for column in ("figure", "value", "assumption"):
        table.add_column(column, justify="right" if column == "value" else "left")
    for figure in projection.figures:
        value = "-" if figure.value is None else f"{figure.value:.2f}{figure.unit if figure.unit == 'x' else ''}"
        value += " ms" if figure.unit == "ms" and figure.value is not None else ""
        table.add_row(figure.name, value, figure.assumption)
    console.print(table)
