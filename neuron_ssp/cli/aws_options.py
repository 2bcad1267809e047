"""What every AWS-facing command group shares: the --region option, its two consoles, how deploy progress
is drawn on them, and how a status record is printed."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

region_option = click.option(
    "--region", envvar=["AWS_REGION", "AWS_DEFAULT_REGION"], show_envvar=True, help="AWS region, e.g. us-east-1."
)


def consoles() -> tuple[Console, Console]:
    """Results to stdout, progress and problems to stderr, so `--json` output stays machine-readable."""
    return Console(), Console(stderr=True)


class ConsoleProgress:
    """Deploy progress (`neuron_ssp.deploy.progress.Progress`) on a console: a spinner while waiting, a
    green tick for each finished step, warnings in yellow."""

    def __init__(self, console: Console) -> None:
        self.console = console

    @contextmanager
    def waiting(self, what: str) -> Iterator[Callable[[str], None]]:
        columns = (
            SpinnerColumn(),
            TextColumn("{task.description}"),
            TextColumn("[dim]{task.fields[detail]}"),
            TimeElapsedColumn(),
        )
        with Progress(*columns, console=self.console, transient=True) as spinner:
            task = spinner.add_task(escape(what), detail="", total=None)
            yield lambda detail: spinner.update(task, detail=escape(detail))

    def done(self, what: str) -> None:
        self.console.print(f"[green]✓[/green] {escape(what)}")

    def note(self, text: str) -> None:
        self.console.print(escape(text))

    def warn(self, text: str) -> None:
        self.console.print(f"[yellow]{escape(text)}")


def print_record(out: Console, title: str, record: dict[str, Any], as_json: bool) -> None:
    """One resource's status: JSON for scripts, or a key/value table ("-" where a value is unknown)."""
    if as_json:
        click.echo(json.dumps(record, indent=2))
        return
    table = Table(title=title, show_header=False)
    for key, value in record.items():
        table.add_row(key, "-" if value is None else str(value))
    out.print(table)
