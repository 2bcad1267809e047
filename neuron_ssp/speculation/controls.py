"""What a request asks, beyond temperature / top-k / top-p, that changes its tokens: a grammar (structured output,
tool calls) and the sampling controls vLLM and OpenAI users send. The server parses the API's fields into these; the
pipeline says what it cannot run (`Pipeline.controls_problems`) and runs the rest inside the loop, speculation
included. Each control is a function of the committed prefix (and of the draft path before a window position), so
acceptance stays exact.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from neuron_ssp.errors import Problem

GrammarKind = Literal["json_schema", "json_object", "regex", "choice", "lark"]
GRAMMAR_KINDS: tuple[GrammarKind, ...] = ("json_schema", "json_object", "regex", "choice", "lark")


@dataclass(frozen=True)
class Grammar:
    """A structured-output constraint as the request gave it."""

    kind: GrammarKind
    # json_schema: the schema as JSON text; json_object: ""; regex: the pattern; choice: a JSON list of strings;
    # lark: a grammar in llguidance's Lark dialect
    source: str
    # the request field that asked for it, for errors: "response_format", "structured_outputs.json", "guided_regex",
    # "tools", "tool_choice", ...
    field: str


@dataclass(frozen=True)
class RequestControls:
    """What a request asks, beyond temperature/top-k/top-p, that changes its tokens. Each is a function of the
    committed prefix (and the draft path before a position), so speculation stays exact."""

    grammar: Grammar | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias added to its logit)
    min_tokens: int = 0  # EOS and stop_token_ids masked until this many tokens are generated
    ignore_eos: bool = False  # EOS does not end the row (the budget does)
    stop_token_ids: tuple[int, ...] = ()  # more ids that end the row (vLLM)
    repetition_penalty: float = 1.0  # vLLM/HF semantics: prompt and output tokens
    presence_penalty: float = 0.0  # OpenAI semantics: output tokens
    frequency_penalty: float = 0.0
    min_p: float = 0.0

    @property
    def changes_logits(self) -> bool:
        """Whether any control other than the row's stop ids touches the target's logits."""
        return (
            self.grammar is not None
            or bool(self.logit_bias)
            or self.min_tokens > 0
            or self.repetition_penalty != 1.0
            or self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
            or self.min_p > 0.0
        )

    @property
    def asked(self) -> list[str]:
        """The names of the controls set away from their defaults, for messages."""
        default = RequestControls()
        return [name for name in _FIELDS if getattr(self, name) != getattr(default, name)]


_FIELDS = (
    "grammar",
    "logit_bias",
    "min_tokens",
    "ignore_eos",
    "stop_token_ids",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "min_p",
)


def value_problems(controls: RequestControls, vocab_size: int) -> list[Problem]:
    """Every control whose value no model could honour (vLLM's rules where it has them), each as a Problem naming
    the control, the value, the rule and the fix."""
    problems = []
    bad_ids = [token for token, _ in controls.logit_bias if not 0 <= token < vocab_size]
    if bad_ids:
        problems.append(
            Problem(
                "logit_bias",
                bad_ids,
                f"token ids must lie in 0..{vocab_size - 1} (the model's vocabulary)",
                "use ids from this model's tokenizer (/tokenize)",
            )
        )
    bad_bias = [bias for _, bias in controls.logit_bias if not math.isfinite(bias)]
    if bad_bias:
        problems.append(Problem("logit_bias", bad_bias, "a bias must be a finite number", "use -100..100"))
    bad_stops = [token for token in controls.stop_token_ids if not 0 <= token < vocab_size]
    if bad_stops:
        problems.append(
            Problem(
                "stop_token_ids",
                bad_stops,
                f"token ids must lie in 0..{vocab_size - 1} (the model's vocabulary)",
                "use ids from this model's tokenizer (/tokenize)",
            )
        )
    if controls.min_tokens < 0:
        problems.append(Problem("min_tokens", controls.min_tokens, "must be 0 or more", "use 0 (no minimum) or more"))
    if not (math.isfinite(controls.repetition_penalty) and controls.repetition_penalty > 0):
        problems.append(
            Problem(
                "repetition_penalty",
                controls.repetition_penalty,
                "must be a number above 0 (1 leaves the logits as they are)",
                "use 1.0 (off) or e.g. 1.1",
            )
        )
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(controls, name)
        if not (math.isfinite(value) and -2.0 <= value <= 2.0):
            problems.append(Problem(name, value, "must lie in -2..2 (OpenAI's range)", "use 0 (off) up to 2"))
    if not (math.isfinite(controls.min_p) and 0.0 <= controls.min_p <= 1.0):
        problems.append(Problem("min_p", controls.min_p, "must lie in 0..1", "use 0 (off) up to 1"))
    if controls.grammar is not None and controls.grammar.kind not in GRAMMAR_KINDS:
        problems.append(
            Problem(
                controls.grammar.field,
                controls.grammar.kind,
                f"unknown grammar kind; one of {', '.join(GRAMMAR_KINDS)}",
                "send a JSON schema, a regex, a choice list or a Lark grammar",
            )
        )
    return problems
