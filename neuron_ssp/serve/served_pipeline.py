"""What the server asks of a pipeline: the part of pipeline.Pipeline that serve/ reads, as a Protocol, so that a
stand-in (the tests' FakePipeline) is checked against it by the type checker rather than trusted to match."""

from __future__ import annotations

from typing import Any, Protocol

import torch

from neuron_ssp.config import Config, SamplingConfig
from neuron_ssp.engines.rows import RowCallbacks, RowLoop, RowRequest
from neuron_ssp.errors import Problem
from neuron_ssp.pipeline.prompt_length import PromptLimit
from neuron_ssp.pipeline.prompts import ChatTurn
from neuron_ssp.speculation.controls import RequestControls


class ServedTarget(Protocol):
    """Of the target, the server reads its context length and vocabulary."""

    @property
    def n_positions(self) -> int: ...

    @property
    def vocab_size(self) -> int: ...


class ServedPipeline(Protocol):
    """pipeline.Pipeline as the server uses it."""

    @property
    def config(self) -> Config: ...

    @property
    def tokenizer(self) -> Any: ...  # a Hugging Face tokenizer (the tests': a character tokenizer of the same calls)

    @property
    def target(self) -> ServedTarget: ...

    @property
    def eos_token_ids(self) -> set[int]: ...

    @property
    def max_batch(self) -> int: ...

    @property
    def extra_slots(self) -> int: ...

    @property
    def scores_tokens(self) -> bool: ...

    @property
    def template_renders_tools(self) -> bool: ...

    @property
    def prompt_limit(self) -> PromptLimit: ...

    def encode(
        self, prompt: str, chat_template: bool | None = None, limit: PromptLimit | None = None
    ) -> torch.Tensor: ...

    def encode_messages(
        self,
        messages: list[dict[str, Any]],
        limit: PromptLimit | None = None,
        turn: ChatTurn = ChatTurn(),
        tools: list[dict[str, Any]] | None = None,
    ) -> torch.Tensor: ...

    def check_room(self, prompt_ids: torch.Tensor, max_new_tokens: int) -> None: ...

    def request_sampling(
        self,
        temperature: float | None = None,
        top_p: float | None = None,
        top_k: int | None = None,
        seed: int | None = None,
    ) -> SamplingConfig: ...

    def controls_problems(self, controls: RequestControls) -> list[Problem]: ...

    def row_loop(self) -> RowLoop: ...

    def row_request(
        self,
        prompt_ids: torch.Tensor,
        max_new_tokens: int,
        sampling: SamplingConfig,
        callbacks: RowCallbacks,
        controls: RequestControls = RequestControls(),
    ) -> RowRequest: ...
