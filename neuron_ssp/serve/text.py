"""Committed token ids -> text pieces that keep each token's origin, cut at the request's stop strings.

Origin of a token: "draft" (a drafted token the target accepted), "target" (a token the target chose:
a rejection's correction, a bonus token or a plain step) or "unknown" (the library engine). While
streaming, text that could still be the start of a stop string is held back, so a client never
receives a stop string, not even in part, unless the request asked for it (vLLM's include_stop_str_in_output:
the text then ends with the stop string). Decoding is incremental (pipeline/text.py).

`returned_tokens` counts the tokens whose text is returned: a step commits several tokens at once, and
the ones after a stop string are neither sent nor counted in `usage` (OpenAI's completion_tokens).
"""

from __future__ import annotations

from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from neuron_ssp.pipeline.text import IncrementalDecoder


@dataclass
class TokenLogprob:
    """One committed token under the target's distribution: its log-probability and the most likely ones."""

    token: str  # the token's own text
    logprob: float
    top: list[tuple[str, float]]  # (token text, logprob), most likely first
    offset: int = 0  # where the token's text starts in the returned text (set when it is added)


@dataclass
class TextPiece:
    """The text one committed token completed, where it came from, and the token (a stop string may cut it)."""

    text: str
    origin: str  # "draft" | "target" | "unknown"
    token: int  # the id whose decoding completed this text


class TokenText:
    def __init__(self, tokenizer: PreTrainedTokenizerBase, stop: list[str], include_stop: bool = False):
        self.decoder = IncrementalDecoder(tokenizer)
        self.stop = stop
        self.include_stop = include_stop  # vLLM's include_stop_str_in_output: the text ends after the stop string
        self.hold = max((len(s) for s in stop), default=1) - 1
        self.starts: list[int] = []  # where each token's text starts in `text`
        self.logprobs: list[TokenLogprob] = []  # per token, when the request asked for them
        self.released = 0  # logprobs handed out
        self.text = ""  # decoded so far (cut at a stop string once one is found)
        self.pending: list[TextPiece] = []  # decoded, not yet handed out
        self.sent = 0  # characters handed out
        self.stopped = False

    def add(self, token: int, origin: str, logprob: TokenLogprob | None = None) -> None:
        """Decode one more token; a multi-byte character lands on the token that completes it."""
        if self.stopped:
            return
        self.starts.append(len(self.text))
        if logprob is not None:
            logprob.offset = len(self.text)
            self.logprobs.append(logprob)
        piece = self.decoder.add(token)
        if not piece:
            return
        self.text += piece
        self.pending.append(TextPiece(piece, origin, token))
        self._cut_at_stop(len(self.text) - len(piece))

    @property
    def returned_tokens(self) -> int:
        """Tokens whose text is (at least in part) returned: all of them unless a stop string cut the text."""
        if not self.stopped:
            return len(self.starts)
        return sum(1 for start in self.starts if start < len(self.text))

    @property
    def sent_tokens(self) -> int:
        """Tokens whose text has been handed out (at least in part)."""
        return sum(1 for start in self.starts if start < self.sent)

    def take_logprobs(self, final: bool = False) -> list[TokenLogprob]:
        """Logprobs of the tokens whose text has been handed out (all returned tokens when final)."""
        end = self.returned_tokens if final else self.sent_tokens
        end = min(end, len(self.logprobs))
        out, self.released = self.logprobs[self.released : end], max(self.released, end)
        return out

    def _cut_at_stop(self, new_from: int) -> None:
        start = max(new_from - self.hold, 0)
        hits = [(i, len(s)) for s in self.stop if (i := self.text.find(s, start)) >= 0]
        if not hits:
            return
        self.stopped = True
        at, length = min(hits, key=lambda hit: hit[0])  # the earliest; of two there, the first listed
        self.text = self.text[: at + length if self.include_stop else at]
        self._trim_pending(len(self.text))

    def _trim_pending(self, end: int) -> None:
        kept, position = [], self.sent
        for piece in self.pending:
            room = end - position
            if room <= 0:
                break
            kept.append(TextPiece(piece.text[:room], piece.origin, piece.token))
            position += len(kept[-1].text)
        self.pending = kept

    def take(self, final: bool = False) -> list[TextPiece]:
        """Pieces safe to send now: all of them when final or stopped, else all but the held-back tail."""
        end = len(self.text) if final or self.stopped else len(self.text) - self.hold
        out, position = [], self.sent
        while self.pending and position < end:
            piece = self.pending[0]
            room = end - position
            if len(piece.text) <= room:
                out.append(self.pending.pop(0))
            else:
                out.append(TextPiece(piece.text[:room], piece.origin, piece.token))
                self.pending[0] = TextPiece(piece.text[room:], piece.origin, piece.token)
            position += len(out[-1].text)
        self.sent = position
        return out
