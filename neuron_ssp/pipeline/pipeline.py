"""`Pipeline`: a loaded target (and draft), a tokenizer and an engine; what the CLI, the server and
the tools drive. It encodes text, generates speculatively or plainly through the same target, and
decodes the result."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from neuron_ssp.backends.base import ModelBackend
from neuron_ssp.config import Config, SamplingConfig
from neuron_ssp.engines.base import CommitCallback, GenerationResult, LogitsCallback, StopCheck, TokenCallback
from neuron_ssp.engines.native import plain_generate
from neuron_ssp.engines.rows import Generator, RowCallbacks, RowLoop, RowRequest
from neuron_ssp.errors import Problem, UsageError
from neuron_ssp.pipeline.build import Shared, engine_controls_problems, refuse_unhonoured, request_settings
from neuron_ssp.pipeline.controls import Grammars, processor_for, stop_ids
from neuron_ssp.pipeline.prompt_length import PromptLimit, token_reach
from neuron_ssp.pipeline.prompts import ChatTurn, encode_messages, encode_prompt, renders_tools
from neuron_ssp.pipeline.text import TextCallback, TextStream
from neuron_ssp.speculation.controls import RequestControls, value_problems
from neuron_ssp.topology.positions import (
    draft_slots,
    extra_target_slots,
    max_prompt_within,
    require_room,
    slot_library,
    target_slots,
)


@dataclass
class TextResult:
    text: str
    tokens: list[int]
    result: GenerationResult


@dataclass
class Pipeline:
    """Everything one generation needs; `speculative` and `plain` share the same target backend. `shared`:
    what every request shares (build.Shared: the call cost, the acceptance counts, the drafter); `max_batch`: the
    requests its loop runs at once, what it was loaded for (the server's `serving_batch`)."""

    config: Config
    tokenizer: PreTrainedTokenizerBase
    target: ModelBackend
    draft: ModelBackend | None
    generator: Generator
    eos_token_ids: set[int]
    shared: Shared
    max_batch: int = 1

    def encode(self, prompt: str, chat_template: bool | None = None, limit: PromptLimit | None = None) -> torch.Tensor:
        """The prompt's ids; `chat_template` None follows the config (False: raw text, as /v1/completions); with a
        `limit` (the server's `prompt_limit`), a text that cannot fit is refused before it is tokenized."""
        use_template = self.config.generation.chat_template if chat_template is None else chat_template
        return encode_prompt(self.tokenizer, prompt, use_template, limit)

    def encode_messages(
        self,
        messages: list[dict[str, Any]],
        limit: PromptLimit | None = None,
        turn: ChatTurn = ChatTurn(),
        tools: list[dict[str, Any]] | None = None,
    ) -> torch.Tensor:
        """A conversation through the chat template, ending as `turn` says, with `tools` passed to the template;
        one user turn encodes exactly as `encode`."""
        return encode_messages(self.tokenizer, messages, self.config.generation.chat_template, limit, turn, tools)

    @cached_property
    def template_renders_tools(self) -> bool:
        """Whether the chat template renders tools itself (else the server renders them: serve/tool_calls.py)."""
        return renders_tools(self.tokenizer, self.config.generation.chat_template)

    @cached_property
    def prompt_limit(self) -> PromptLimit:
        """The longest prompt that leaves the target room for one new token, and what a token of this tokenizer
        can stand for (pipeline/prompt_length.py: read once, it walks the vocabulary)."""
        return PromptLimit(max_prompt_within(self.target.n_positions, self.extra_slots), token_reach(self.tokenizer))

    @property
    def extra_slots(self) -> int:
        """Cache slots the engine writes past our loop's last one (neuron_ssp.topology.positions)."""
        spec = self.config.speculation
        return extra_target_slots(spec.engine, spec.k, slot_library(self.config))

    def check_room(self, prompt_ids: torch.Tensor, max_new_tokens: int) -> None:
        """The n_positions rules the engine enforces for target and draft, asked before a request is queued."""
        prompt_len, spec, library = prompt_ids.shape[0], self.config.speculation, slot_library(self.config)
        if prompt_len == 0:
            raise UsageError(Problem("prompt", "", "the prompt is empty", "pass a non-empty prompt"))
        require_room(
            self.target.n_positions,
            target_slots(prompt_len, max_new_tokens, spec.engine, spec.k, library),
            prompt_len,
            max_new_tokens,
            "target.n_positions",
        )
        if self.draft is not None:
            require_room(
                self.draft.n_positions,
                draft_slots(prompt_len, max_new_tokens, spec.engine, spec.k, library),
                prompt_len,
                max_new_tokens,
                "draft.n_positions",
            )

    def request_sampling(
        self,
        temperature: float | None = None,
        top_p: float | None = None,
        top_k: int | None = None,
        seed: int | None = None,
    ) -> SamplingConfig:
        """One request's sampling: its fields over the config's, or a UsageError naming what this engine
        cannot honour per request. A sampled request without a seed gets a fresh one (as OpenAI's and
        vLLM's servers do), so two identical requests differ; the result carries that seed, to reproduce it.
        """
        given = {"temperature": temperature, "top_p": top_p, "top_k": top_k, "seed": seed}
        sampling = self.config.sampling.model_copy(update={k: v for k, v in given.items() if v is not None})
        if seed is None and sampling.temperature > 0 and self.config.speculation.engine != "fused":
            sampling = sampling.model_copy(update={"seed": secrets.randbits(63)})
        refuse_unhonoured(self.config, sampling)
        return sampling

    def generate_ids(
        self,
        prompt_ids: torch.Tensor,
        max_new_tokens: int,
        sampling: SamplingConfig | None = None,
        on_commit: CommitCallback | None = None,
        should_stop: StopCheck | None = None,
        on_logits: LogitsCallback | None = None,
        on_tokens: TokenCallback | None = None,
        controls: RequestControls = RequestControls(),
    ) -> GenerationResult:
        """One request with its own sampling settings, alone in the engine's row loop, as the server runs it.

        `on_commit(tokens, from_draft, drafted)` reports each step's tokens, how many of them are
        accepted draft tokens and how many were drafted; `on_logits(rows)` (our loop only) the target's
        logits that chose them, just before; `should_stop()` is asked once per iteration and cancels
        the generation. transformers-neuronx's engines (library, fused) run their loop in one call: the tokens
        arrive together at the end, and a cancel takes effect only after it returns. `controls`: the request's
        grammar and sampling controls (a UsageError listing `controls_problems` where this pipeline cannot run them).
        """
        sampling = sampling or self.config.sampling
        if on_logits is not None and not self.scores_tokens:
            raise UsageError(logprobs_problem(self.config.speculation.engine))
        callbacks = RowCallbacks(on_tokens, on_commit, on_logits, should_stop)
        return self.row_loop().run(self.row_request(prompt_ids, max_new_tokens, sampling, callbacks, controls))

    @property
    def scores_tokens(self) -> bool:
        """Whether the engine reports the target's logits per committed token (logprobs): our loop only."""
        return self.config.speculation.engine == "native"

    def row_loop(self) -> RowLoop:
        """The engine's loop over the target's slots (one loop at a time per target: it owns them)."""
        return self.generator.row_loop()

    def controls_problems(self, controls: RequestControls) -> list[Problem]:
        """Every reason this pipeline cannot run a request's controls (a value no model honours, an engine that
        samples on the device, a grammar that does not compile), all at once: the server answers one 400 listing
        them before the request is queued."""
        refused = engine_controls_problems(self.config, controls)  # names the grammar's field where it refuses it
        grammar = [] if refused else self.grammars.problems(controls)
        return value_problems(controls, self.target.vocab_size) + refused + grammar

    @cached_property
    def grammars(self) -> Grammars:
        """The grammars compiled for this pipeline's tokenizer (each once per kind and source)."""
        return Grammars(self.tokenizer, self.eos_token_ids, self.target.vocab_size)

    def row_request(
        self,
        prompt_ids: torch.Tensor,
        max_new_tokens: int,
        sampling: SamplingConfig,
        callbacks: RowCallbacks,
        controls: RequestControls = RequestControls(),
    ) -> RowRequest:
        """One request as a row of the engine's loop, with its sampling settings, seed and controls."""
        refuse_unhonoured(self.config, sampling)
        problems = self.controls_problems(controls)
        if problems:
            raise UsageError(problems)
        vocab, eos = self.target.vocab_size, self.eos_token_ids
        processors = processor_for(controls, vocab, eos, self.grammars)
        settings = request_settings(self.config, sampling, self.draft, self.shared, controls.min_p, processors)
        return settings.request(prompt_ids, max_new_tokens, stop_ids(eos, controls), callbacks)

    def speculative(
        self, prompt: str, on_text: TextCallback | None = None, max_new_tokens: int | None = None
    ) -> TextResult:
        """The prompt through the engine's row loop with the config's sampling: the server's path for one request."""
        streamer = TextStream(self.tokenizer, on_text) if on_text else None
        result = self.generate_ids(
            self.encode(prompt), max_new_tokens or self.config.generation.max_new_tokens, on_tokens=streamer
        )
        return self._text(result)

    def plain(self, prompt: str, on_text: TextCallback | None = None, max_new_tokens: int | None = None) -> TextResult:
        streamer = TextStream(self.tokenizer, on_text) if on_text else None
        result = plain_generate(
            self.target,
            self.encode(prompt),
            max_new_tokens or self.config.generation.max_new_tokens,
            self.config.sampling,
            self.eos_token_ids,
            streamer,
        )
        return self._text(result)

    def _text(self, result: GenerationResult) -> TextResult:
        return TextResult(str(self.tokenizer.decode(result.tokens, skip_special_tokens=True)), result.tokens, result)


def logprobs_problem(engine: str) -> Problem:
    return Problem(
        "logprobs",
        True,
        f"engine {engine} does not report the target's distribution per token",
        "leave logprobs out, or serve with speculation.engine: native",
    )
