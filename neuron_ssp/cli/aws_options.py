"""What every AWS-facing command group shares: the --region option, its two consoles, and how a status
record is printed."""

from __future__ import annotations

import json
from typing import Any

import click
from rich.console import Console
from rich.table import Table

region_option = click.option(
    "--region", envvar=["AWS_REGION", "AWS_DEFAULT_REGION"], show_envvar=True, help="AWS region, e.g. us-east-1."
)


def consoles() -> tuple[Console, Console]:
    """Results to stdout, progress and problems to stderr, so `--json` output stays machine-readable."""
    return Console(), Console(stderr=True)


def print_record(out: Console, title: str, record: dict[str, Any], as_json: bool) -> None:
    """One resource's status: JSON for scripts, or a key/value table ("-" where a value is unknown)."""
    if as_json:
        click.echo(json.dumps(record, indent=2))
        return
    table = Table(title=title, show_header=False)
    for key, value in record.items():
        table.add_row(key, "-" if value is None else str(value))
    out.print(table)
