"""Benchmark prompts: a JSONL file with one {"prompt": ..., "category": ...} object per line.

The default set is Spec-Bench's six categories (see benchmarks/PROMPTS_NOTICE.md). Selection keeps
categories balanced, so a handful of prompts still covers copy-heavy and open-ended text alike.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from neuron_ssp.errors import Problem, UsageError

DEFAULT_PROMPTS = Path(__file__).resolve().parent.parent / "data" / "prompts_dev.jsonl"
UNCATEGORISED = "uncategorised"


@dataclass(frozen=True)
class BenchPrompt:
    category: str
    text: str


def load_prompts(path: Path = DEFAULT_PROMPTS) -> list[BenchPrompt]:
    if not path.is_file():
        raise UsageError(
            Problem(
                "--prompts",
                str(path),
                "the file does not exist",
                'pass a JSONL file with one {"prompt": ..., "category": ...} per line',
            )
        )
    prompts = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UsageError(
                Problem(
                    "--prompts",
                    f"{path}:{number}",
                    f"line {number} is not JSON ({exc.msg})",
                    "write one JSON object per line",
                )
            ) from None
        text = row.get("prompt") if isinstance(row, dict) else None
        if not isinstance(text, str) or not text.strip():
            raise UsageError(
                Problem(
                    "--prompts",
                    f"{path}:{number}",
                    "no non-empty 'prompt' string on this line",
                    'give every line a "prompt" field with the text',
                )
            )
        prompts.append(BenchPrompt(str(row.get("category") or UNCATEGORISED), text))
    if not prompts:
        raise UsageError(Problem("--prompts", str(path), "the file holds no prompts", "add one JSON object a line"))
    return prompts


def by_category(
    prompts: Sequence[BenchPrompt],
    categories: Sequence[str] = (),
    per_category: int | None = None,
    half: str | None = None,
) -> dict[str, list[BenchPrompt]]:
    """{category: its prompts} in file order, restricted to `categories` when given, to one `half`
    (half_of) when given, then to the first `per_category`."""
    grouped: dict[str, list[BenchPrompt]] = {}
    for prompt in prompts:
        grouped.setdefault(prompt.category, []).append(prompt)
    unknown = [c for c in categories if c not in grouped]
    if unknown:
        raise UsageError(
            Problem(
                "--categories",
                ",".join(unknown),
                "no prompt of this category in the file",
                f"choose from {', '.join(sorted(grouped))}",
            )
        )
    if per_category is not None and per_category < 1:
        raise UsageError(Problem("--nb-prompts", per_category, "must be >= 1", "pass 1 or more"))
    chosen = {c: grouped[c] for c in list(categories) or list(grouped)}
    if half is not None:
        chosen = half_of(chosen, half)
    return {c: group[:per_category] for c, group in chosen.items()}


HALVES = ("choose", "report")


def half_of(grouped: dict[str, list[BenchPrompt]], half: str) -> dict[str, list[BenchPrompt]]:
    """Per category, the prompts at even positions (`choose`: settings are chosen on them) or odd ones
    (`report`: the figures reported for those settings), so no reported prompt was tuned on."""
    if half not in HALVES:
        raise UsageError(Problem("--half", half, "not a half of the prompt set", f"use one of {', '.join(HALVES)}"))
    parity = HALVES.index(half)
    return {category: group[parity::2] for category, group in grouped.items()}


def balanced(prompts: Sequence[BenchPrompt], count: int) -> list[BenchPrompt]:
    """`count` prompts taken round-robin across categories (the first of each, then the second, ...)."""
    if count < 1:
        raise UsageError(Problem("--nb-prompts", count, "must be >= 1", "pass 1 or more"))
    groups = list(by_category(prompts).values())
    picked = [group[i] for i in range(max(len(g) for g in groups)) for group in groups if i < len(group)]
    return picked[:count]
