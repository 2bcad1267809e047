"""The root click group and the one place where user errors become messages and exit codes."""

from __future__ import annotations

import json
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.panel import Panel

from neuron_ssp.errors import NeuronSSPError

err_console = Console(stderr=True)


class _Group(click.Group):
    """Turns our errors into a readable panel (or JSON with --json) instead of a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        as_json = "--json" in ctx.args  # read before click hands the arguments to the subcommand
        try:
            return super().invoke(ctx)
        except NeuronSSPError as exc:
            report_error(exc, as_json)
            ctx.exit(exc.exit_code)


def report_error(exc: NeuronSSPError, as_json: bool = False) -> None:
    if as_json:
        click.echo(json.dumps({"error": [p.to_dict() for p in exc.problems]}, indent=2))
        return
    title = "invalid input" if exc.exit_code == 2 else "cannot continue"
    body = "\n\n".join(  # escape: rules and fixes quote things like `pip install 'neuron-ssp[deploy]'`
        f"[bold]{escape(p.field)}[/bold] = {escape(repr(p.value))}\n  rule: {escape(p.rule)}\n  fix:  {escape(p.fix)}"
        for p in exc.problems
    )
    err_console.print(
        Panel(body, title=f"neuron-ssp: {title} ({len(exc.problems)} problem(s))", border_style="red", expand=False)
    )


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="neuron-ssp")
def main() -> None:
    """Speculative sampling for Llama on AWS Inferentia2/Trainium, with a PyTorch reference backend.

    k is the speculation window (as in transformers-neuronx): per iteration the draft proposes
    k-1 tokens and the target scores k positions in one call (gamma = k-1 in the literature).
    """
