"""A progress bar over a time budget, for the long jobs (draft-data, train-draft) that run in slices.

On a terminal it is a rich bar; in a log file (a job in the background) it prints one line a minute instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

Update = Callable[[float, str], None]  # (seconds spent, what to show)


@contextmanager
def budget_bar(console: Console, label: str, seconds: float, line_every: float = 60.0) -> Iterator[Update]:
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[info]}"),
    )
    logged = [0.0]
    with Progress(*columns, console=console) as bar:
        task = bar.add_task(label, total=seconds, info="")

        def update(spent: float, info: str) -> None:
            bar.update(task, completed=spent, info=info)
            if not console.is_terminal and spent - logged[0] >= line_every:
                console.print(f"{label} {spent:.0f} s: {info}")
                logged[0] = spent

        yield update
