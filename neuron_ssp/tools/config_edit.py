"""Write a tuned k back into a YAML config, keeping the file's comments and layout.

A targeted line edit: the `k:` line inside the top-level `speculation:` block gets the new value (its
trailing comment stays); a missing line or block is added. Where the file is laid out so that the
edit cannot be made safely (flow style, anchors), the config is rewritten with a note on top.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from neuron_ssp.config import Config, read_yaml
from neuron_ssp.errors import Problem, UsageError

SECTION = re.compile(r"^speculation:\s*(#.*)?$")
TOP_LEVEL = re.compile(r"^[^\s#]")
K_LINE = re.compile(r"^(?P<indent>\s+)k:(?P<space>\s*)(?P<value>[^#\s][^#]*?)?(?P<rest>\s*(#.*)?)$")
INDENTED = re.compile(r"^(?P<indent>\s+)\S")
REWRITE_NOTE = "# Written by `neuron-ssp tune-k --write`; the original layout could not be edited in place.\n"


def write_k(path: Path, k: int, config: Config) -> str:
    """Set speculation.k = k in the file at `path` (created from `config` when missing); returns how."""
    if not path.exists():
        _rewrite(path, k, config)
        return "created"
    edited = edit_k_text(path.read_text(), k)
    if edited is not None:
        _write(path, edited)
        if _k_in(path) == k:
            return "edited in place (comments kept)"
    _rewrite(path, k, config)
    return "rewritten (comments could not be kept)"


def edit_k_text(text: str, k: int) -> str | None:
    """The text with speculation.k set to k, or None when the layout is not the plain block style."""
    lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if SECTION.match(line.rstrip("\n"))), None)
    if start is None:
        if re.search(r"^speculation\s*:", text, flags=re.MULTILINE):
            return None  # e.g. `speculation: {k: 4}`: not ours to restyle by hand
        return text + ("" if text.endswith("\n") or not text else "\n") + f"speculation:\n  k: {k}\n"
    end = next((i for i in range(start + 1, len(lines)) if TOP_LEVEL.match(lines[i])), len(lines))
    indent = "  "
    for i in range(start + 1, end):
        line = lines[i].rstrip("\n")
        if match := K_LINE.match(line):
            newline = "\n" if lines[i].endswith("\n") else ""
            lines[i] = f"{match['indent']}k:{match['space'] or ' '}{k}{match['rest']}{newline}"
            return "".join(lines)
        if match := INDENTED.match(line):
            indent = match["indent"]
    lines.insert(start + 1, f"{indent}k: {k}\n")
    return "".join(lines)


def _k_in(path: Path) -> int | None:
    spec = read_yaml(path).get("speculation")
    return spec.get("k") if isinstance(spec, dict) else None


def _rewrite(path: Path, k: int, config: Config) -> None:
    data = config.model_dump(mode="json", exclude_none=True)
    data["speculation"]["k"] = k
    _write(path, REWRITE_NOTE + yaml.safe_dump(data, sort_keys=False))


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text)
    except OSError as exc:
        raise UsageError(Problem("--write", str(path), f"cannot write the config ({exc.strerror})",
                                 "pass a writable path")) from None
