"""Rich tables for generation results: one place so every command reads the same way."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.cells import cell_len
from rich.console import Console
from rich.table import Table

from neuron_ssp.config import Config
from neuron_ssp.speculation.stats import GenerationStats

console = Console()
status_console = Console(stderr=True)
SEPARATOR = " | "


def stats_table(stats: GenerationStats, title: str = "speculative sampling") -> Table:
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column("metric", style="bold")
    table.add_column("value", justify="right")
    per_position = ", ".join("-" if a is None else f"{a:.2f}" for a in stats.per_position_acceptance)
    rows = [
        ("new tokens", f"{stats.new_tokens}"),
        ("tokens/s", f"{stats.tokens_per_s:.1f}"),
        ("ms/token", f"{stats.ms_per_token:.1f}"),
        ("acceptance rate", f"{stats.acceptance_rate:.3f}  ({stats.accepted_tokens}/{stats.draft_tokens} drafted)"),
        ("mean accepted length τ", f"{stats.mean_accepted_length:.2f} tokens per target call (Spec-Bench)"),
        (
            "vLLM mean accept. length",
            f"{stats.vllm_mean_acceptance_length:.2f} (1 + accepted / {stats.num_drafts} drafts)",
        ),
        ("target calls", f"{stats.target_calls} (+1 prefill)"),
        ("acceptance per position", per_position or "-"),
        (
            "time draft / target / overhead",
            f"{stats.time_draft_s:.3f} / {stats.time_target_s:.3f} / {stats.time_overhead_s:.3f} s",
        ),
    ]
    if stats.tokens_after_eos:
        rows.append(
            (
                "generated past EOS",
                f"{stats.tokens_after_eos} tokens, cut on the host: included in the time and acceptance figures above",
            )
        )
    for name, value in rows:
        table.add_row(name, value)
    return table


def describe(config: Config) -> str:
    """The config's settings as "name value" fields joined by " | ", on one line (see `fit_fields`)."""
    s = config.speculation
    return SEPARATOR.join(
        (
            str(config.target.path),
            f"drafter {s.drafter}",
            f"k={s.k} (draft {s.k - 1})",
            f"acceptor {s.acceptor}",
            f"policy {s.policy}",
            f"temperature {config.sampling.temperature}",
        )
    )


def pack_fields(fields: Sequence[str], width: int) -> list[str]:
    """Fields joined by " | " into lines of at most `width` cells, broken only between fields.

    Rich wraps at any space, so at 80 columns a header read 'acceptor' at one line's end and
    'probabilistic' at the next. A field wider than `width` gets a line of its own (the terminal folds it).
    """
    lines: list[str] = []
    for field in fields:
        if lines and cell_len(lines[-1] + SEPARATOR + field) <= width:
            lines[-1] += SEPARATOR + field
        else:
            lines.append(field)
    return lines


def fit_fields(text: str, width: int | None = None) -> str:
    """Each line of `text` re-packed by its " | " fields to `width` (the console's by default)."""
    width = width or console.width
    return "\n".join(packed for line in text.split("\n") for packed in pack_fields(line.split(SEPARATOR), width))


def titled_table(title: str, **kwargs: Any) -> Table:
    """A left-justified Table whose title breaks only between fields at the console's width.

    Rich wraps a title again at its table's width, which is often narrower than the console; the table is
    made at least as wide as the title's longest line (up to the console's width) so that it does not.
    """
    fitted = fit_fields(title)
    widest = max(cell_len(line) for line in fitted.split("\n"))
    return Table(title=fitted, title_justify="left", min_width=min(widest, console.width), **kwargs)
