"""Committed token ids -> printable text deltas, for streaming to a terminal or a client.

Decoding the whole sequence again for every token costs O(n^2) over a stream. `IncrementalDecoder`
decodes only a short window of recent tokens, with the prefix/read offsets of vLLM's incremental
detokenizer (vllm/transformers_utils/detokenizer_utils.py, `detokenize_incrementally`): the text of
the window's already-read tokens is decoded next to the text of the whole window, and the difference
is the new text. Both decodes start at the same token, so whatever a tokenizer does at the start of
a text (SentencePiece drops a leading space) it does to both alike, and a window ending inside a
multi-byte character (U+FFFD) waits for the token that completes it. It needs only `decode`, so it
works with every tokenizer and every `tokenizers` version (DecodeStream arrived in 0.21; the
transformers 4.46.3 leg has 0.20.3).
"""

from __future__ import annotations

from collections.abc import Callable

from transformers import PreTrainedTokenizerBase

TextCallback = Callable[[str], None]


class IncrementalDecoder:
    """Token ids -> the text each one adds; the deltas join to `decode(all ids, skip_special_tokens=True)`."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.prefix_offset = 0  # the window starts here: context that makes the first new token decode right
        self.read_offset = 0  # tokens before this one have been turned into text

    def add(self, token: int) -> str:
        """The new text once `token` is committed ("" while a character is incomplete, or for a special token)."""
        self.ids.append(token)
        prefix_text = self._decode(self.ids[self.prefix_offset : self.read_offset])
        new_text = self._decode(self.ids[self.prefix_offset :])
        if len(new_text) <= len(prefix_text) or new_text.endswith("\ufffd"):
            return ""
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return new_text[len(prefix_text) :]

    def _decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=True)) if ids else ""


class TextStream:
    """Hands each step's new text to `on_text` (the CLI's live output)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, on_text: TextCallback):
        self.decoder = IncrementalDecoder(tokenizer)
        self.on_text = on_text

    def __call__(self, tokens: list[int]) -> None:
        text = "".join(self.decoder.add(token) for token in tokens)
        if text:
            self.on_text(text)
