"""The suffix drafter's history on disk: one JSON header line, then one line of token ids per request.

Appending one line per finished request costs O(request), not O(history), and a crash can only
tear the last line. Loading checks everything (header, model, vocabulary, every token) and raises
`HistoryFileError` naming what is wrong; the caller then starts empty, and `set_aside` renames the
bad file so the next save does not append to it.
"""

from __future__ import annotations

import json
from pathlib import Path

FORMAT = "neuron-ssp suffix history"
VERSION = 1


class HistoryFileError(Exception):
    """The persist file cannot be read back as a history for this model."""


class HistoryFile:
    def __init__(self, path: str | Path, model: str, vocab_size: int):
        self.path = Path(path).expanduser()
        self.model = model
        self.vocab_size = vocab_size

    def header(self) -> str:
        return json.dumps({"format": FORMAT, "version": VERSION, "model": self.model, "vocab_size": self.vocab_size})

    def load(self) -> list[list[int]]:
        """Sequences, oldest first; [] when the file does not exist yet."""
        if not self.path.exists():
            return []
        try:
            lines = self.path.read_text().splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise HistoryFileError(f"cannot be read ({exc})") from None
        if not lines:
            return []
        self._check_header(lines[0])
        return [self._sequence(number, line) for number, line in enumerate(lines[1:], start=2) if line.strip()]

    def _check_header(self, line: str) -> None:
        try:
            head = json.loads(line)
        except json.JSONDecodeError:
            raise HistoryFileError("line 1 is not the JSON header of a suffix history") from None
        if not isinstance(head, dict) or head.get("format") != FORMAT or head.get("version") != VERSION:
            raise HistoryFileError(f"line 1 is not a '{FORMAT}' version {VERSION} header")
        if head.get("model") != self.model or head.get("vocab_size") != self.vocab_size:
            raise HistoryFileError(
                f"it was written for model {head.get('model')!r} (vocabulary {head.get('vocab_size')}), "
                f"not {self.model!r} (vocabulary {self.vocab_size}): token ids would mean other words"
            )

    def _sequence(self, number: int, line: str) -> list[int]:
        try:
            tokens = json.loads(line)
        except json.JSONDecodeError:
            raise HistoryFileError(f"line {number} is not JSON (a torn write?)") from None
        if not isinstance(tokens, list) or not all(type(t) is int and 0 <= t < self.vocab_size for t in tokens):
            raise HistoryFileError(f"line {number} is not a list of token ids in 0..{self.vocab_size - 1}")
        return tokens

    def append(self, tokens: list[int]) -> None:
        new = not self.path.exists() or self.path.stat().st_size == 0
        with self.path.open("a") as out:
            if new:
                out.write(self.header() + "\n")
            out.write(json.dumps(tokens) + "\n")

    def rewrite(self, sequences: list[list[int]]) -> None:
        """Replace the file with exactly these sequences (after eviction on load), atomically."""
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text("".join([self.header() + "\n"] + [json.dumps(s) + "\n" for s in sequences]))
        tmp.replace(self.path)

    def set_aside(self) -> Path:
        """Move a bad file out of the way (kept for inspection); returns its new name."""
        aside = self.path.with_name(self.path.name + ".corrupt")
        self.path.replace(aside)
        return aside
