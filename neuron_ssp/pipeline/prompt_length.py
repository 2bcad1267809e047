"""The fewest tokens a text can encode to, known before it is encoded: a prompt that cannot fit the model's
context is refused without paying for its tokenization (about 0.5 s of CPU per MB of text on SmolLM2's tokenizer).

The bound: every kept character of the text lies in at least one token, and a token stands for at most L characters
of the text, where L is the length of the longest string in the vocabulary (special tokens included). So a text of C
kept characters is at least ceil(C / L) tokens, and a prompt whose bound is over the context cannot fit whatever the
merges do. Each token's string is at least as long as the text it stands for: a byte-level vocabulary (GPT-2,
Llama-3, SmolLM2) writes one character per byte and a character is at least one byte; a SentencePiece vocabulary
(Llama-2) writes the text's own characters, a space as "▁"; a byte-fallback token "<0xE2>" stands for less than one
character. A character is kept unless the tokenizer drops it: byte-level BPE skips a byte that has no token, and
SmolLM2's vocabulary has none for six control characters (U+0004, U+0006, U+0013, U+0014, U+0016, U+001D), so
"\\x04" * 1000 encodes to no token at all. Those are counted out.

That holds only while the tokenizer cannot make the text shorter before it splits it, so the bound is given only
for the pieces read from a fast tokenizer's own description (`tokenizer.json`) that cannot: no normalizer or one
that only prepends or replaces a string by one at least as long; pre-tokenizers that split without removing text;
a BPE model that reaches every character (byte fallback with all 256 byte tokens, an unknown token given to each
unknown character, or a byte-level pre-tokenizer whose missing byte tokens are single-byte characters only: BPE
drops a character it has no token for, and `fuse_unk` makes a run of them one token); and no special token that
strips the white space beside it. Anything else (NFC composition, accent stripping, BERT's white-space splitting,
WordPiece's one [UNK] per unknown word, a slow tokenizer) gets no bound: its prompts are tokenized and then measured.

The server passes the longest prompt that leaves room for one new token (`Pipeline.prompt_limit`): a refused prompt
is one the n_positions check would refuse after tokenizing, so the bound never turns away a prompt that fits.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from tokenizers import pre_tokenizers

from neuron_ssp.errors import Problem, UsageError

KEEPING_PRE_TOKENIZERS = {"ByteLevel", "Metaspace", "Digits", "Split", "Punctuation", "UnicodeScripts"}
CONTINUATION_BYTES = range(0x80, 0xC0)  # the second byte of U+0080..U+00BF is each of them


@dataclass(frozen=True)
class TokenReach:
    """What one token can stand for: at most `longest` characters of a text, never one of `dropped` (characters the
    tokenizer drops, having no token for any of their bytes)."""

    longest: int
    dropped: str = ""

    def fewest_tokens(self, text: str) -> int:
        kept = len(text) - sum(text.count(c) for c in self.dropped)
        return math.ceil(kept / self.longest)


@dataclass(frozen=True)
class PromptLimit:
    """The most tokens a prompt may have, and what a token of the tokenizer can stand for (None: unknown)."""

    max_tokens: int
    reach: TokenReach | None

    def refuse_unfittable(self, text: str, field: str) -> None:
        """A UsageError when `text` cannot fit in max_tokens tokens, before it is tokenized."""
        fewest = self.reach.fewest_tokens(text) if self.reach else 0
        if fewest > self.max_tokens:
            raise UsageError(
                Problem(
                    field,
                    f"{len(text)} characters",
                    f"at least {fewest} tokens (no token of this tokenizer stands for more than "
                    f"{self.reach.longest if self.reach else 0} characters), more than the {self.max_tokens} a prompt "
                    "may have to leave room in the model's context for one new token",
                    "shorten the prompt",
                ),
            )


def token_reach(tokenizer: Any) -> TokenReach | None:
    """What one token of `tokenizer` can stand for, or None where the tokenizer may shorten a text before splitting
    it (the module docstring says which)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    spec, vocab = json.loads(backend.to_str()), tokenizer.get_vocab()
    model, pre_tokenizer = spec.get("model") or {}, spec.get("pre_tokenizer")
    dropped = _dropped(model, pre_tokenizer, vocab)
    if (
        dropped is None
        or not _keeps_length(spec.get("normalizer"))
        or not _splits_only(pre_tokenizer)
        or any(added.get("lstrip") or added.get("rstrip") for added in spec.get("added_tokens") or [])
    ):
        return None
    longest = max((len(token) for token in vocab), default=0)
    return TokenReach(longest, dropped) if longest else None


def _keeps_length(normalizer: dict[str, Any] | None) -> bool:
    if normalizer is None:
        return True
    kind = normalizer.get("type")
    if kind == "Sequence":
        return all(_keeps_length(n) for n in normalizer.get("normalizers", []))
    if kind == "Prepend":
        return True
    if kind == "Replace":
        pattern = normalizer.get("pattern", {})
        return "String" in pattern and len(normalizer.get("content", "")) >= len(pattern["String"])
    return False


def _splits_only(pre_tokenizer: dict[str, Any] | None) -> bool:
    if pre_tokenizer is None:
        return True
    kind = pre_tokenizer.get("type")
    if kind == "Sequence":
        return all(_splits_only(p) for p in pre_tokenizer.get("pretokenizers", []))
    return kind in KEEPING_PRE_TOKENIZERS and pre_tokenizer.get("behavior") != "Removed"


def _dropped(model: dict[str, Any], pre_tokenizer: dict[str, Any] | None, vocab: dict[str, int]) -> str | None:
    """The characters a BPE model drops (none with byte fallback or an unknown token for each unknown character;
    under a byte-level pre-tokenizer, the one-byte characters whose byte has no token), or None when it may drop
    more than whole one-byte characters or fuse them."""
    if model.get("type") != "BPE":
        return None
    if model.get("byte_fallback") and all(f"<0x{b:02X}>" in vocab for b in range(256)):
        return ""
    if model.get("unk_token") is not None and not model.get("fuse_unk"):
        return ""
    if not _has_byte_level(pre_tokenizer):
        return None
    as_bytes = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    if any(as_bytes.pre_tokenize_str(chr(b))[0][0][-1] not in vocab for b in CONTINUATION_BYTES):
        return None  # a character of continuation bytes only could vanish: give no bound
    return "".join(chr(b) for b in range(0x80) if as_bytes.pre_tokenize_str(chr(b))[0][0] not in vocab)


def _has_byte_level(pre_tokenizer: dict[str, Any] | None) -> bool:
    if pre_tokenizer is None:
        return False
    if pre_tokenizer.get("type") == "Sequence":
        return any(_has_byte_level(p) for p in pre_tokenizer.get("pretokenizers", []))
    return pre_tokenizer.get("type") == "ByteLevel"
