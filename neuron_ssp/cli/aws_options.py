"""What every AWS-facing command group shares: the --region option and its two consoles."""

from __future__ import annotations

import click
from rich.console import Console

region_option = click.option(
    "--region", envvar=["AWS_REGION", "AWS_DEFAULT_REGION"], show_envvar=True, help="AWS region, e.g. us-east-1."
)


def consoles() -> tuple[Console, Console]:
    """Results to stdout, progress and problems to stderr, so `--json` output stays machine-readable."""
    return Console(), Console(stderr=True)
