"""Committed token ids -> printable text deltas, for streaming to a terminal or a client."""

from __future__ import annotations

from collections.abc import Callable

from transformers import PreTrainedTokenizerBase

TextCallback = Callable[[str], None]


class TextStream:
    """Turns committed token ids into printable text deltas (re-decoding keeps multi-byte chars whole)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, on_text: TextCallback):
        self.tokenizer = tokenizer
        self.on_text = on_text
        self.tokens: list[int] = []
        self.printed = 0

    def __call__(self, tokens: list[int]) -> None:
        self.tokens.extend(tokens)
        text = self.tokenizer.decode(self.tokens, skip_special_tokens=True)
        if text.endswith("\ufffd"):
            return  # an incomplete UTF-8 sequence: wait for the next token
        self.on_text(text[self.printed:])
        self.printed = len(text)
