"""Rich tables for generation results: one place so every command reads the same way."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from neuron_ssp.config import Config
from neuron_ssp.speculation.stats import GenerationStats

console = Console()
status_console = Console(stderr=True)


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
        ("vLLM mean accept. length", f"{stats.vllm_mean_acceptance_length:.2f} (1 + accepted / {stats.num_drafts} "
                                     "drafts)"),
        ("target calls", f"{stats.target_calls} (+1 prefill)"),
        ("acceptance per position", per_position or "-"),
        ("time draft / target / overhead",
         f"{stats.time_draft_s:.3f} / {stats.time_target_s:.3f} / {stats.time_overhead_s:.3f} s"),
    ]
    if stats.tokens_after_eos:
        rows.append(("generated past EOS", f"{stats.tokens_after_eos} tokens, cut on the host: included in the "
                                           "time and acceptance figures above"))
    for name, value in rows:
        table.add_row(name, value)
    return table


def describe(config: Config) -> str:
    s = config.speculation
    return (f"{config.target.path} | drafter {s.drafter} | k={s.k} (draft {s.k - 1}) | "
            f"acceptor {s.acceptor} | policy {s.policy} | temperature {config.sampling.temperature}")
