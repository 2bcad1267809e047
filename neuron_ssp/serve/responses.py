"""OpenAI response bodies and SSE chunks (vLLM's shapes), plus the documented extra field `speculative`.

`speculative` in a final body: acceptance_rate, mean_accepted_length, target_calls, draft_tokens,
accepted_tokens of this request, and the random seed it sampled with. In each stream chunk: `tokens` (the
chunk's text split per token, each with `origin` "draft" | "target" | "unknown") and the running
draft_tokens / accepted_tokens / target_calls; the chunk with the finish_reason carries the final
statistics. OpenAI clients ignore it.

`logprobs` (when asked): OpenAI's shapes, chat `{"content": [{"token", "logprob", "bytes", "top_logprobs"}]}`
and completions `{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`, per returned token.
"""

from __future__ import annotations

import json
import time
from typing import Any

from neuron_ssp.serve.errors import ApiError
from neuron_ssp.serve.text import TokenLogprob
from neuron_ssp.serve.tool_calls import CallStream, ToolUse, finish_reason, read_calls
from neuron_ssp.serve.worker import Delta, Done
from neuron_ssp.speculation.stats import GenerationStats, merge_stats

DONE_LINE = "data: [DONE]\n\n"


def sse(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


def speculative_stats(stats: GenerationStats, seed: int | None) -> dict[str, Any]:
    return {
        "acceptance_rate": stats.acceptance_rate,
        "mean_accepted_length": stats.mean_accepted_length,
        "target_calls": stats.target_calls,
        "draft_tokens": stats.draft_tokens,
        "accepted_tokens": stats.accepted_tokens,
        "seed": seed,
    }


def chat_logprobs(entries: list[TokenLogprob]) -> dict[str, Any]:
    def one(token: str, logprob: float) -> dict[str, Any]:
        return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8", "backslashreplace"))}

    return {"content": [{**one(e.token, e.logprob), "top_logprobs": [one(t, lp) for t, lp in e.top]} for e in entries]}


def completion_logprobs(entries: list[TokenLogprob]) -> dict[str, Any]:
    return {
        "tokens": [e.token for e in entries],
        "token_logprobs": [e.logprob for e in entries],
        "top_logprobs": [dict(e.top) for e in entries],
        "text_offset": [e.offset for e in entries],
    }


def _stats(done: list[Done]) -> GenerationStats:
    """The request's speculation statistics: its one choice's, or the sums over its choices."""
    return done[0].stats if len(done) == 1 else merge_stats([d.stats for d in done])


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None) -> dict[str, Any]:
    """OpenAI's usage; `cached_tokens`: the prompt tokens that came from the prefix cache (None: not known, as in
    a stream cut short before its end)."""
    counts: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if cached_tokens is not None:
        counts["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return counts


class OpenAIFormat:
    """Bodies for one request of kind "chat" or "completion", of one choice or `n` (each under its index)."""

    def __init__(
        self,
        kind: str,
        request_id: str,
        model: str,
        prompt_tokens: int,
        include_usage: bool = False,
        logprobs: bool = False,
        tools: ToolUse | None = None,
    ):
        self.chat = kind == "chat"
        self.logprobs = logprobs
        self.tools = tools if tools is not None and tools.parsed else None  # the answer is read as calls
        self.calls: dict[int, CallStream] = {}  # per choice, with tools
        self.id = f"{'chatcmpl' if self.chat else 'cmpl'}-{request_id}"
        self.model = model
        self.prompt_tokens = prompt_tokens
        self.include_usage = include_usage
        self.created = int(time.time())
        self.returned: dict[int, int] = {}  # per choice: tokens whose text the stream has sent

    def final(self, done: list[Done]) -> dict[str, Any]:
        """The body of every choice; usage sums their tokens (the prompt's counted once, as OpenAI and vLLM do)."""
        return {
            **self._head(stream=False),
            "choices": [self._choice(d) for d in done],
            "usage": usage(self.prompt_tokens, sum(d.completion_tokens for d in done), done[0].stats.cached_tokens),
            "speculative": speculative_stats(_stats(done), done[0].seed),
        }

    def _choice(self, done: Done) -> dict[str, Any]:
        choice: dict[str, Any] = {
            "index": done.choice,
            "finish_reason": done.finish_reason,
            "logprobs": self._logprobs(done.logprobs),
        }
        if not self.chat:
            choice["text"] = done.text
            return choice
        choice["message"] = {"role": "assistant", "content": done.text}
        if self.tools:
            calls, content = read_calls(done.text, self.tools)
            if calls:
                choice["message"] = {"role": "assistant", "content": content, "tool_calls": [c.body() for c in calls]}
            choice["finish_reason"] = finish_reason(self.tools, calls, done.finish_reason)
        return choice

    def first_chunks(self, choices: int) -> list[str]:
        """Chat streams open each choice with the assistant role (as OpenAI and vLLM do); completions have none."""
        if not self.chat:
            return []
        return [
            sse(self._chunk({"role": "assistant", "content": ""}, None, {"tokens": []}, index=i))
            for i in range(choices)
        ]

    def delta_chunks(self, delta: Delta) -> list[str]:
        """The step's text as one chunk; with tools, the text that is not held back as a call, and a chunk per delta
        of each call it completed (vLLM's shape: the call's index, id, type and name, then its arguments)."""
        pieces, progress, index = delta.pieces, delta.progress, delta.choice
        self.returned[index] = delta.returned
        text = "".join(p.text for p in pieces)
        extra = {
            "tokens": [{"text": p.text, "origin": p.origin} for p in pieces],
            "draft_tokens": progress.drafted,
            "accepted_tokens": progress.accepted,
            "target_calls": max(progress.target_calls, 0),
        }
        logprobs = self._logprobs(delta.logprobs if self.logprobs else None)
        if self.tools is None:
            return [sse(self._chunk({"content": text} if self.chat else text, None, extra, logprobs, index))]
        stream = self.calls.setdefault(index, CallStream(self.tools))
        content, calls = stream.add(text)
        chunks = [sse(self._chunk({"content": content}, None, extra, logprobs, index))] if content or not calls else []
        first = len(stream.calls) - len(calls)
        for number, call in enumerate(calls, first):
            named = {"index": number, "id": call.id, "type": "function", "function": {"name": call.name}}
            said = extra if not chunks else {"tokens": []}
            chunks.append(sse(self._chunk({"tool_calls": [named]}, None, said, index=index)))
            arguments = {"index": number, "function": {"arguments": call.arguments}}
            chunks.append(sse(self._chunk({"tool_calls": [arguments]}, None, {"tokens": []}, index=index)))
        return chunks

    def choice_end_chunks(self, done: Done) -> list[str]:
        """A choice's last chunks: what it held back that is not a call, then its finish_reason and statistics."""
        reason, index = done.finish_reason, done.choice
        stream = self.calls.get(index)
        held = stream.finish() if stream else ""
        if self.tools:
            reason = finish_reason(self.tools, stream.calls if stream else [], done.finish_reason)
        chunks = [sse(self._chunk({"content": held}, None, {"tokens": []}, index=index))] if held else []
        stats = {"tokens": [], **speculative_stats(done.stats, done.seed)}
        chunks.append(sse(self._chunk({} if self.chat else "", reason, stats, index=index)))
        return chunks

    def last_chunks(self, done: list[Done]) -> list[str]:
        """After every choice's end: the usage when asked, then [DONE]."""
        tokens, cached = sum(d.completion_tokens for d in done), done[0].stats.cached_tokens  # the prompt's, once
        usage_chunk = [self._usage_chunk(tokens, cached)] if self.include_usage else []
        return [*usage_chunk, DONE_LINE]

    def failed_chunks(self, error: ApiError) -> list[str]:
        """A stream that ends in an error (a timeout, the drain's cut, a failure): the usage of what was sent when
        asked, then the error, then [DONE]. The usage comes first: an OpenAI client raises at the error chunk
        (openai 3.57.0, _streaming.py:96-107) and reads nothing after it."""
        usage_chunk = [self._usage_chunk(sum(self.returned.values()))] if self.include_usage else []
        return [*usage_chunk, sse(error.body()), DONE_LINE]

    def _usage_chunk(self, completion_tokens: int, cached_tokens: int | None = None) -> str:
        counts = usage(self.prompt_tokens, completion_tokens, cached_tokens)
        return sse({**self._head(stream=True), "choices": [], "usage": counts})

    def _logprobs(self, entries: list[TokenLogprob] | None) -> dict[str, Any] | None:
        if entries is None:
            return None
        return chat_logprobs(entries) if self.chat else completion_logprobs(entries)

    def _chunk(
        self,
        delta: dict[str, Any] | str,
        finish_reason: str | None,
        extra: dict[str, Any],
        logprobs: dict[str, Any] | None = None,
        index: int = 0,
    ) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": index, "finish_reason": finish_reason, "logprobs": logprobs}
        if self.chat:
            choice["delta"] = delta
        else:
            choice["text"] = delta
        body = {**self._head(stream=True), "choices": [choice], "speculative": extra}
        if self.include_usage:
            body["usage"] = None
        return body

    def _head(self, stream: bool) -> dict[str, Any]:
        kind = ("chat.completion.chunk" if stream else "chat.completion") if self.chat else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}
