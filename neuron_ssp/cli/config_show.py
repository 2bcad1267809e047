"""`neuron-ssp config`: the effective configuration a command would run, and where each value came from.

A file is completed by one rule (`neuron_ssp.config.resolve_config`); this shows its outcome, as YAML that
loads back as the same config, each value commented with its source, or as JSON.
"""

from __future__ import annotations

import json
from typing import Any

import click
import yaml

from neuron_ssp.cli.options import echo_json, generation_options, resolved_from_options
from neuron_ssp.config import DEFAULT_CONFIG, FROM_EMBEDDED, ResolvedConfig, fallback_problems, flat_fields

COMMENT_COLUMN = 44  # where the source comments start, so they line up


@click.command("config")
@generation_options
def config_command(as_json: bool, **options: Any) -> None:
    """Print the effective configuration: --config FILE (or the embedded default) completed by the loading
    rule, with the flags applied, each value with where it came from: flag, file, embedded default
    (neuron_ssp/data/default.yaml) or schema default. The text output is YAML that loads as the same config.
    """
    resolved = resolved_from_options(options)
    if as_json:
        echo_json(effective_dict(resolved))
    else:
        click.echo(effective_yaml(resolved), nl=False)


def effective_yaml(resolved: ResolvedConfig) -> str:
    """Every field of the config as YAML, each value commented with its source; a header says the rule."""
    lines = [f"# {line}" for line in _header(resolved)]
    previous: list[str] = []
    for field, value in flat_fields(resolved.config).items():
        *sections, key = field.split(".")
        opened = _shared_depth(sections, previous)  # the sections the field before opened
        lines += [f"{'  ' * depth}{sections[depth]}:" for depth in range(opened, len(sections))]
        previous = sections
        text = f"{'  ' * len(sections)}{key}: {_yaml_value(value)}"
        lines.append(f"{text:<{COMMENT_COLUMN}} # {_source_text(resolved, field)}")
    return "\n".join(lines) + "\n"


def effective_dict(resolved: ResolvedConfig) -> dict[str, Any]:
    """The JSON shape: the config, its file, what the file was merged onto, each field's source, the fallbacks."""
    return {
        "path": None if resolved.path is None else str(resolved.path),
        "base": resolved.base,
        "config": resolved.config.model_dump(mode="json"),
        "sources": resolved.sources,
        "fallbacks": [p.to_dict() for p in fallback_problems(resolved)],
    }


def _shared_depth(a: list[str], b: list[str]) -> int:
    depth = 0
    while depth < min(len(a), len(b)) and a[depth] == b[depth]:
        depth += 1
    return depth


def _shared_depth(a: list[str], b: list[str]) -> int:
    depth = 0
    while depth < min(len(a), len(b)) and a[depth] == b[depth]:
        depth += 1
    return depth


def _header(resolved: ResolvedConfig) -> list[str]:
    config = resolved.config
    if resolved.path is None:
        where = f"the embedded default ({DEFAULT_CONFIG.name} in neuron_ssp/data), no --config"
    elif resolved.base == FROM_EMBEDDED:
        where = f"{resolved.path}, completed by the embedded default (it runs the embedded default's model)"
    else:
        where = (
            f"{resolved.path}, completed by the schema's defaults (it runs {config.target.path} on "
            f"{config.platform.backend}, not the embedded default's model)"
        )
    return [f"effective config: {where}", "each value's source: flag, file, embedded default or schema default"]


def _source_text(resolved: ResolvedConfig, field: str) -> str:
    source = resolved.sources[field]
    if field in resolved.fallbacks:
        return f"{source}; the embedded default's is {_yaml_value(resolved.fallbacks[field])}"
    return source


def _yaml_value(value: Any) -> str:
    """One value as inline YAML that reads back as itself."""
    if isinstance(value, list):
        return "[" + ", ".join(_yaml_value(item) for item in value) + "]"
    if isinstance(value, str) and not value.isprintable():
        return json.dumps(value)  # a double-quoted YAML string: its escapes (\n) read back as written
    return yaml.safe_dump(value, width=float("inf")).split("\n", 1)[0]
