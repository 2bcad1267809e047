"""A request's controls (speculation/controls.py) made into what its row runs with: the ids that end it, and a fresh
set of logits processors per row over the pipeline's compiled grammars."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace
from typing import Any

import torch

from neuron_ssp.config import Config
from neuron_ssp.engines.rows import ProcessorFor
from neuron_ssp.errors import Problem
from neuron_ssp.pipeline.build import controls_refusal
from neuron_ssp.speculation.controls import RequestControls
from neuron_ssp.speculation.grammar import GrammarCompiler, grammar_support_problem
from neuron_ssp.speculation.processors import RowProcessor


def stop_ids(eos_token_ids: Collection[int], controls: RequestControls) -> set[int]:
    """The ids that end the row: the model's EOS (unless ignore_eos) and the request's stop_token_ids."""
    return (set() if controls.ignore_eos else set(eos_token_ids)) | set(controls.stop_token_ids)


class Grammars:
    """A pipeline's grammar compiler, built at the first grammar request (llguidance reads the tokenizer, ~0.4 s)."""

    def __init__(self, tokenizer: Any, eos_token_ids: Collection[int], vocab_size: int):
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.vocab_size = vocab_size
        self._compiler: GrammarCompiler | None = None

    @property
    def compiler(self) -> GrammarCompiler:
        if self._compiler is None:
            self._compiler = GrammarCompiler(self.tokenizer, self.eos_token_ids, self.vocab_size)
        return self._compiler

    def problems(self, controls: RequestControls) -> list[Problem]:
        """Why the request's grammar cannot run here: no llguidance (or too old a glibc), no fast tokenizer, or a
        grammar that does not compile."""
        grammar = controls.grammar
        if grammar is None:
            return []
        unsupported = grammar_support_problem(grammar.field)
        if unsupported is not None:
            return [unsupported]
        if self.tokenizer is None or not getattr(self.tokenizer, "is_fast", False):
            return [
                Problem(
                    grammar.field,
                    grammar.kind,
                    "structured output needs the model's fast (Rust) tokenizer, and this model has none",
                    "add tokenizer.json to the model directory, or leave the grammar out",
                )
            ]
        return self.compiler.problems(grammar)


def processor_for(
    controls: RequestControls, vocab_size: int, eos_token_ids: Collection[int], grammars: Grammars
) -> ProcessorFor | None:
    """A fresh set of processors for each row of the request (None when its controls change no logits); its
    grammar from the compiled one (`Grammars.problems` said it compiles)."""
    if not replace(controls, min_p=0.0).changes_logits:  # min_p lives in the sampling transform (sampling.py)
        return None
    ends = stop_ids(eos_token_ids, controls)

    def make(prompt_ids: torch.Tensor) -> RowProcessor:
        matcher = grammars.compiler.matcher(controls.grammar) if controls.grammar is not None else None
        return RowProcessor(controls, vocab_size, prompt_ids, ends, eos_token_ids, matcher)

    return make


def serving_notes(config: Config) -> list[Problem]:
    """What `validate` says of structured output and the sampling controls for a config: which requests its engine
    refuses, and whether grammars can run on this machine."""
    notes = []
    why = controls_refusal(config)
    if why is not None:
        notes.append(
            Problem(
                "speculation.engine",
                config.speculation.engine,
                "requests with a grammar (response_format, tools, structured_outputs, guided_*) or sampling controls "
                f"(logit_bias, min_tokens, ignore_eos, stop_token_ids, penalties, min_p) are refused with a 400: {why}",
                "serve with speculation.engine: native to take them (our loop samples on the host, with both Neuron "
                "libraries too)",
            )
        )
    unsupported = grammar_support_problem("structured output")
    if unsupported is not None:
        notes.append(unsupported)
    return notes
