"""Write a tuned k back into a YAML config, keeping the file's comments, key order and layout.

ruamel.yaml's round-trip mode loads the file into mappings that remember their comments, key order,
flow or block style and quotes, so setting `speculation.k` and dumping changes that value and nothing
else (the indentation is guessed from the file, as ruamel.yaml's docs advise); a missing
`speculation:` section is added at the end. ruamel.yaml comes with the optional tools extra.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from neuron_ssp.config import Config, read_yaml
from neuron_ssp.errors import Problem, UsageError
from neuron_ssp.tools.extra import import_extra

OPTION = "--write"


def write_k(path: Path, k: int, config: Config) -> str:
    """Set speculation.k = k in the file at `path` (created from `config` when missing); returns how."""
    if not path.exists():
        data = config.model_dump(mode="json", exclude_none=True)
        data["speculation"]["k"] = k
        _write(path, _dump(_round_trip(), data))
        return "created"
    read_yaml(path)  # the config reader's own checks and messages: it parses, a mapping on top
    _write(path, edit_k_text(path.read_text(), k, str(path)))
    return "edited in place (comments kept)"


def check_editable(path: Path) -> None:
    """Refuse, before a long run, a file whose k cannot be set: not a YAML mapping, or a `speculation`
    that is not a section. A missing file is fine (write_k creates it)."""
    if path.exists():
        read_yaml(path)  # the config reader's own checks and messages: it parses, a mapping on top
        edit_k_text(path.read_text(), 2, str(path))


def edit_k_text(text: str, k: int, source: str = "the YAML text") -> str:
    """`text` (a YAML mapping) with speculation.k set to k, everything else as it was."""
    ruamel_yaml = import_extra("ruamel.yaml", OPTION)
    guess_indent = import_extra("ruamel.yaml.util", OPTION).load_yaml_guess_indent
    yaml = _round_trip()
    try:
        _, indent, sequence_offset = guess_indent(text)  # (its own `yaml=` argument is newer than 0.18)
        document = yaml.load(text)
    except ruamel_yaml.YAMLError as exc:  # e.g. a duplicate key, which PyYAML lets pass
        raise UsageError(
            Problem(
                OPTION,
                source,
                f"the YAML cannot be edited: {str(exc).splitlines()[0]}",
                "fix the file, or write k into another file",
            )
        ) from None
    if indent:
        yaml.indent(mapping=indent, sequence=indent, offset=sequence_offset or 0)
    document = yaml.map() if document is None else document
    if not isinstance(document, dict):
        raise UsageError(
            Problem(
                OPTION,
                source,
                "the top level is not a mapping of sections",
                "write k into a config file (keys such as `target:` and `speculation:`)",
            )
        )
    if document.get("speculation") is None:  # absent, or `speculation:` with nothing under it
        document["speculation"] = yaml.map()
    if not isinstance(document["speculation"], dict):
        raise UsageError(
            Problem(
                OPTION,
                source,
                f"speculation is {document['speculation']!r}, not a section",
                "make it a mapping such as `speculation: {k: 4}`",
            )
        )
    document["speculation"]["k"] = k
    return _dump(yaml, document)


def _round_trip() -> Any:
    yaml = import_extra("ruamel.yaml", OPTION).YAML()  # typ "rt": round trip
    yaml.preserve_quotes = True
    return yaml


def _dump(yaml: Any, data: Any) -> str:
    stream = io.StringIO()
    yaml.dump(data, stream)
    return stream.getvalue()


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text)
    except OSError as exc:
        raise UsageError(
            Problem(OPTION, str(path), f"cannot write the config ({exc.strerror})", "pass a writable path")
        ) from None
