"""Grammars through llguidance: compiled once per (kind, source), one matcher per request.

llguidance (Microsoft's Low-level Guidance, a Rust library with an abi3 wheel and no Python dependencies) turns a
JSON schema, a regex or a Lark grammar into a matcher over the tokenizer's vocabulary: the token mask of the current
state (~40 us on the embedded model's 49,152 tokens), the tokens the grammar forces (`compute_ff_tokens`), how many
of a list of tokens it allows (`validate_tokens`), consuming and rolling back tokens. Compiling a JSON schema takes
~2 ms here; a `GrammarCompiler` keeps each compiled matcher and hands every request a deep copy (~7 us), so a second
request with the same schema compiles nothing.

Its wheel needs glibc >= 2.31 (manylinux_2_31): the Neuron DLAMIs on Ubuntu 22.04 and Amazon Linux 2023 have it,
Amazon Linux 2 (glibc 2.26) does not; there `grammar_support_problem` says so and grammar requests are refused.
"""

from __future__ import annotations

import json
import platform
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from neuron_ssp.errors import Problem
from neuron_ssp.speculation.controls import Grammar

GLIBC_NEEDED = (2, 31)  # llguidance's wheel is tagged manylinux_2_31
# JSON as Python's json.dumps writes it: the separators are forced (drafts the target accepts for free), and a small
# model cannot pad an answer with whitespace for ever
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def glibc_version() -> tuple[int, int] | None:
    """This machine's glibc as (major, minor); None where the C library is not glibc (macOS, musl)."""
    name, version = platform.libc_ver()
    if name != "glibc" or not version:
        return None
    major, minor = (int(part) for part in version.split(".")[:2])
    return major, minor


def grammar_support_problem(field: str = "grammar") -> Problem | None:
    """Why grammars cannot run here (llguidance missing, or a glibc its wheel cannot load on), or None."""
    found = glibc_version()
    if found is not None and found < GLIBC_NEEDED:
        return Problem(
            field,
            f"glibc {found[0]}.{found[1]}",
            "structured output needs llguidance, whose wheel needs glibc >= 2.31 (Amazon Linux 2 has 2.26)",
            "run on Ubuntu 22.04 or Amazon Linux 2023 (the Neuron DLAMIs there have glibc >= 2.31), or leave the "
            "grammar out of the request",
        )
    try:
        import llguidance  # noqa: F401
    except ImportError as exc:
        return Problem(
            field,
            "llguidance",
            f"structured output needs the llguidance package, which does not import here ({exc})",
            "pip install 'neuron-ssp[grammar]' (./setup.sh installs it)",
        )
    return None


def grammar_text(grammar: Grammar) -> str:
    """llguidance's grammar for a request's constraint (its own JSON form; checked when compiled)."""
    from llguidance import LLMatcher

    if grammar.kind == "json_schema":
        return LLMatcher.grammar_from_json_schema(grammar.source, defaults=JSON_OPTIONS)  # type: ignore[arg-type]
    if grammar.kind == "json_object":
        return LLMatcher.grammar_from_json_schema('{"type": "object"}', defaults=JSON_OPTIONS)  # type: ignore[arg-type]
    if grammar.kind == "regex":
        return LLMatcher.grammar_from_regex(grammar.source)
    if grammar.kind == "choice":
        return LLMatcher.grammar_from_regex("|".join(regex_literal(choice) for choice in choices(grammar.source)))
    return LLMatcher.grammar_from_lark(grammar.source)


def choices(source: str) -> list[str]:
    """A choice grammar's strings (a JSON list of at least one string), or ValueError saying what is wrong."""
    try:
        found = json.loads(source)
    except json.JSONDecodeError as exc:
        raise ValueError(f"a choice list must be a JSON list of strings ({exc})") from None
    if not isinstance(found, list) or not found or not all(isinstance(item, str) for item in found):
        raise ValueError("a choice list must be a non-empty JSON list of strings")
    return found


_REGEX_SPECIAL = set("\\.+*?()|[]{}^$#&-~")


def regex_literal(text: str) -> str:
    """`text` as a regex that matches exactly it, in the syntax llguidance reads (Rust's regex crate)."""
    return "(" + "".join("\\" + char if char in _REGEX_SPECIAL else char for char in text) + ")"


@dataclass(frozen=True)
class CompileResult:
    """A compiled grammar's pristine matcher (copied for every request), or the reason it does not compile."""

    matcher: Any | None
    error: str = ""


class GrammarCompiler:
    """One tokenizer's grammars: compiled once per (kind, source) and kept. `compiles` counts real compilations,
    so a test (and the benchmark) can see that a second request with the same schema compiled nothing."""

    def __init__(self, tokenizer: Any, eos_token_ids: Collection[int], vocab_size: int):
        """`tokenizer`: the model's Hugging Face fast tokenizer; `eos_token_ids`: every id that ends a turn (the
        grammar allows them where it accepts and stops on them); `vocab_size`: the model's logits width."""
        from llguidance.hf import from_tokenizer

        self.tokenizer = from_tokenizer(tokenizer, n_vocab=vocab_size, eos_token=sorted(eos_token_ids))
        self.eos_token_ids = frozenset(eos_token_ids)
        self.vocab_size = vocab_size
        self.compiles = 0
        self._compiled: dict[tuple[str, str], CompileResult] = {}

    def compile(self, grammar: Grammar) -> CompileResult:
        key = (grammar.kind, grammar.source)
        if key not in self._compiled:
            self._compiled[key] = self._compile(grammar)
        return self._compiled[key]

    def _compile(self, grammar: Grammar) -> CompileResult:
        from llguidance import LLMatcher

        self.compiles += 1
        try:
            text = grammar_text(grammar)
        except ValueError as exc:
            return CompileResult(None, str(exc))
        error = LLMatcher.validate_grammar(text, self.tokenizer)
        if error:
            return CompileResult(None, error.strip())
        matcher = LLMatcher(self.tokenizer, text, log_level=0)
        return CompileResult(None, matcher.get_error()) if matcher.is_error() else CompileResult(matcher)

    def problems(self, grammar: Grammar) -> list[Problem]:
        """Why this grammar cannot constrain a request (it does not compile), naming the request's field."""
        result = self.compile(grammar)
        if result.matcher is not None:
            return []
        what = {"json_schema": "JSON schema", "json_object": "JSON object", "choice": "choice list"}
        return [
            Problem(
                grammar.field,
                grammar.source if len(grammar.source) <= 200 else grammar.source[:200] + "...",
                f"the {what.get(grammar.kind, grammar.kind)} does not compile: {first_lines(result.error)}",
                "fix it (llguidance's JSON schema subset, Rust regex syntax, or its Lark dialect)",
            )
        ]

    def matcher(self, grammar: Grammar) -> GrammarMatcher:
        """A fresh matcher at the grammar's start for one request (the grammar must compile: `problems`)."""
        result = self.compile(grammar)
        if result.matcher is None:
            raise ValueError(f"{grammar.field}: {result.error}")
        return GrammarMatcher(result.matcher.deep_copy(), self.vocab_size, self.eos_token_ids)


def first_lines(text: str, lines: int = 5) -> str:
    return " / ".join(line.strip() for line in text.strip().splitlines()[:lines])


class GrammarMatcher:
    """One request's grammar state at its committed tokens; the masks along a draft path are computed by consuming
    the path and rolling it back, so the committed state never moves until tokens are committed.

    A path is consumed only up to its first EOS: llguidance does not record an EOS taken where the grammar had
    already stopped, so rolling it back would undo a real token. Nothing is drawn after an EOS (it ends the row),
    so the rows after one get a mask allowing EOS alone."""

    def __init__(self, matcher: Any, vocab_size: int, eos_token_ids: Collection[int]):
        self._matcher = matcher
        self.vocab_size = vocab_size
        self.eos_token_ids = frozenset(eos_token_ids)
        self._bytes = (vocab_size + 7) // 8
        eos_only = np.zeros(self._bytes * 8, dtype=np.uint8)
        eos_only[sorted(self.eos_token_ids)] = 1
        self._eos_only = np.packbits(eos_only, bitorder="little")

    def allowed(self, path: list[int]) -> torch.Tensor:
        """(vocab_size,) bool: the tokens the grammar allows after the committed tokens and `path` (tokens the
        grammar allows, as `valid_prefix` checked)."""
        return self.allowed_along(path, 1)[0]

    def allowed_along(self, path: list[int], rows: int) -> torch.Tensor:
        """(rows, vocab_size) bool: the masks after the committed tokens and path[:len(path) - rows + 1 + j] for
        row j, each from the state after the tokens before it (never from an un-advanced state)."""
        words = self.words_along(path, rows)
        bits = np.unpackbits(words, axis=1, count=self.vocab_size, bitorder="little")
        return torch.from_numpy(bits).view(torch.bool)

    def words_along(self, path: list[int], rows: int) -> np.ndarray:
        """`allowed_along` packed as llguidance gives it: (rows, ceil(vocab_size / 8)) uint8, token t at bit t % 8
        (low bit first) of byte t // 8, ids past the tokenizer's vocabulary 0."""
        first = len(path) - rows + 1
        ends = next((i for i, token in enumerate(path) if token in self.eos_token_ids), len(path))
        consumed = 0
        masks = []
        try:
            for j in range(rows):
                before = first + j  # path tokens before row j
                if before > ends:
                    masks.append(self._eos_only)
                    continue
                while consumed < before:
                    self._consume(path[consumed])
                    consumed += 1
                masks.append(self._words())
        finally:
            if consumed:
                self._matcher.rollback(consumed)
        return np.stack(masks)

    def _consume(self, token: int) -> None:
        if not self._matcher.consume_token(token):
            raise RuntimeError(f"grammar: token {token} is not allowed here ({self._matcher.get_error()})")

    def valid_prefix(self, path: list[int]) -> int:
        """How many leading tokens of `path` the grammar allows in turn after the committed tokens (nothing after
        an EOS)."""
        if not path:
            return 0
        valid = int(self._matcher.validate_tokens(path))
        ends = next((i for i, token in enumerate(path) if token in self.eos_token_ids), len(path))
        return min(valid, ends + 1)

    def forced(self) -> list[int]:
        """The tokens the grammar forces next (llguidance's fast-forward tokens)."""
        return list(self._matcher.compute_ff_tokens())

    def commit(self, tokens: list[int]) -> None:
        """Committed tokens move the state; an EOS where the grammar already stopped is not consumed (llguidance
        refuses a token after its end, EOS included, through consume_tokens)."""
        for token in tokens:
            if token in self.eos_token_ids and self.stopped:
                return
            self._consume(token)

    @property
    def stopped(self) -> bool:
        """Nothing but EOS can follow (the grammar is complete, or it ended on an EOS)."""
        return bool(self._matcher.is_stopped())

    def _words(self) -> np.ndarray:
        words = np.frombuffer(self._matcher.compute_bitmask(), dtype=np.uint8)[: self._bytes]
        if words.shape[0] < self._bytes:  # ids past the tokenizer's vocabulary: never allowed
            words = np.concatenate([words, np.zeros(self._bytes - words.shape[0], dtype=np.uint8)])
        if self.vocab_size % 8:
            words = words.copy()
            words[-1] &= (1 << (self.vocab_size % 8)) - 1
        return words


def set_ids(words: np.ndarray) -> np.ndarray:
    """The ids of the bits set in a packed mask (token t at bit t % 8 of byte t // 8), found byte-wise: a mask is
    mostly zero bytes (or, inverted, mostly full ones), so this touches few of its 49,152 bits."""
    at = np.flatnonzero(words)
    rows, bits = np.nonzero(np.unpackbits(words[at][:, None], axis=1, bitorder="little"))
    return at[rows] * 8 + bits
