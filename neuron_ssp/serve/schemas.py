"""The request bodies and their rules: OpenAI chat/completions (vLLM's field set) and LMI/TGI.

Every rule a single field obeys is a constraint on its pydantic model (types strict: JSON integers, numbers,
booleans, no "3" or true for an integer; finite numbers; 64-bit seeds; valid Unicode; ranges and lengths), so
one declaration both checks a body (serve/validation.py turns each error into field, value, rule and fix,
all at once) and states the limit in /openapi.json. Rules between two fields (DEPENDS_ON) are checked here
and stated there as `if`/`then`. Unknown fields are accepted and ignored, as OpenAI's and vLLM's servers do,
except those that would change the answer and that this server cannot honour (declared with `refused`): those
are refused, unless they carry the value that asks for nothing (what OpenAI clients send as defaults). The fields
that change a request's tokens (vLLM's sampling extras, structured output) become one `RequestControls`
(serve/controls.py), which the pipeline runs or refuses (`Pipeline.controls_problems`); serve/requests.py turns a
body into the request the worker runs.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, Tag

from neuron_ssp.errors import Problem
from neuron_ssp.serve.fields import Body, Text, refused, refused_fields, unicode_text
from neuron_ssp.serve.tool_calls import CallIn, NamedToolChoice, ToolDef, Turn

MAX_STOP_STRINGS = 4  # OpenAI's limit
MAX_CHOICES = 128  # OpenAI's limit on n (the server's capacity may be less: /openapi.json states it)
MAX_TOP_LOGPROBS = 20  # OpenAI's limit for chat (completions: 5); vLLM's default max_logprobs
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1  # vLLM's seed bounds (torch.long); torch seeds take any of them
# Python's white space (str.isspace, what the prompt checks strip; none lies above U+3000) as a pattern that
# pydantic's regex and JSON Schema's both read: a text must hold one character outside it
NOT_BLANK = "[^" + "".join(f"\\u{i:04x}" for i in range(0x3001) if chr(i).isspace()) + "]"
NOT_SUPPORTED = "not supported by this server (docs/serving.md lists the fields it honours)"
CHAT_ONLY = "tools are for /v1/chat/completions: a completions prompt has no conversation to render them in"
DEPRECATED = "OpenAI's deprecated function calling: this server takes its successor, tools and tool_choice"
REFUSAL_RULES = {
    "tools": CHAT_ONLY,
    "tool_choice": CHAT_ONLY,
    "functions": DEPRECATED,
    "function_call": DEPRECATED,
    "chat_template": (
        "a chat template sent with a request is a program the server would run (Jinja): like vLLM without "
        "--trust-request-chat-template, this server renders only the model's own template"
    ),
}
DEPENDS_ON = {"stream_options": "stream", "top_logprobs": "logprobs"}  # allowed only with the other one true
EXCLUSIVE = (("continue_final_message", "add_generation_prompt"),)  # not both true (vLLM's rule)


def _integral(value: Any) -> Any:
    """JSON Schema's integer: 3.0 is one (Python's parser reads it as a float), "3" and true are not."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


INTEGRAL = BeforeValidator(_integral)  # after a type's constraints, so that JSON Schema states them
Prompt = Annotated[str, Field(pattern=NOT_BLANK), AfterValidator(unicode_text)]  # constraints first: then the
StopString = Annotated[str, Field(min_length=1), AfterValidator(unicode_text)]  # JSON Schema states them too
StopList = Annotated[list[StopString], Field(max_length=MAX_STOP_STRINGS)]
Seed = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX), INTEGRAL]
Budget = Annotated[int, Field(ge=1), INTEGRAL]
Temperature = Annotated[float, Field(ge=0, le=2)]
TopP = Annotated[float, Field(gt=0, le=1)]
TopK = Annotated[int, Field(ge=-1), INTEGRAL]
TopLogprobs = Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS), INTEGRAL]
Choices = Annotated[int, Field(ge=1, le=MAX_CHOICES), INTEGRAL]


# what a sampling field is for: the OpenAPI description, and the reason a message gives with a field's rule
SEED = "64-bit: send it back to reproduce a sample"
BUDGET = "tokens to generate at most: with the prompt's they must fit the model's context (max_model_len)"
TEMPERATURE = "0 = greedy; 2 at most, OpenAI's range, which vLLM 0.33.0 enforces too"
TOP_P, TOP_K = "nucleus sampling: 1 = off", "0 or -1 = off (vLLM's extra field; vLLM prefers 0)"


def _dependencies(model: type[BaseModel]) -> list[tuple[str, str]]:
    """The DEPENDS_ON pairs that are both fields of `model` (an unknown field is ignored, whatever its name)."""
    return [
        (name, other)
        for name, other in DEPENDS_ON.items()
        if name in model.model_fields and other in model.model_fields
    ]


def state_rules(schema: dict[str, Any], model: type[BaseModel]) -> None:
    """The model's rules between fields in JSON Schema: a field that is set (not null) requires the other one true;
    of two EXCLUSIVE fields, the second may not be true when the first is."""
    rules: list[dict[str, Any]] = [
        {
            "if": {"properties": {name: {"not": {"type": "null"}}}, "required": [name]},
            "then": {"properties": {other: {"const": True}}, "required": [other]},
        }
        for name, other in _dependencies(model)
    ]
    rules += [
        {
            "if": {"properties": {first: {"const": True}}, "required": [first]},
            "then": {"properties": {second: {"enum": [False, None]}}},
        }
        for first, second in EXCLUSIVE
        if first in model.model_fields and second in model.model_fields
    ]
    if "tools" in model.model_fields and "tools" not in refused_fields(model):  # tool_choice needs tools, unless none
        chooses = {"anyOf": [{"enum": ["auto", "required"]}, {"type": "object"}]}
        rules.append(
            {
                "if": {"properties": {"tool_choice": chooses}, "required": ["tool_choice"]},
                "then": {"properties": {"tools": {"type": "array"}}, "required": ["tools"]},
            }
        )
    if rules:
        schema["allOf"] = rules


class TextPart(Body):
    type: Literal["text"]
    text: Text


def _text_or_calls(schema: dict[str, Any]) -> None:
    """The rule on a message, stated: text (content), or calls (an assistant message's tool_calls)."""
    schema["anyOf"] = [
        {"required": ["content"], "properties": {"content": {"not": {"type": "null"}}}},
        {
            "required": ["role", "tool_calls"],
            "properties": {"role": {"const": "assistant"}, "tool_calls": {"type": "array", "minItems": 1}},
        },
    ]


class ChatMessage(Body):
    model_config = ConfigDict(json_schema_extra=_text_or_calls)

    role: Literal["system", "user", "assistant", "developer", "tool"] = Field(
        description="developer is OpenAI's newer name for system, and is rendered as system"
    )
    content: Text | list[TextPart] | None = Field(None, description="may be null in an assistant message with calls")
    tool_calls: Annotated[list[CallIn], Field(min_length=1)] | None = Field(
        None, description="an assistant message's calls (ignored in other messages)"
    )
    tool_call_id: Text | None = Field(None, description="in a tool message: the call it answers")


class StreamOptions(Body):
    include_usage: bool = False


class JsonSchemaFormat(Body):
    name: Text | None = None
    description: Text | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema", description="the JSON Schema the answer follows")
    strict: bool | None = Field(None, description="constrained either way (as vLLM does)")


class ResponseFormat(Body):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = Field(None, description="with type json_schema")


class StructuredOutputs(Body):
    """vLLM's `structured_outputs`: one of json, regex, choice, grammar or json_object."""

    json_: dict[str, Any] | Text | None = Field(None, alias="json", description="a JSON Schema (object or its text)")
    regex: Text | None = None
    choice: Annotated[list[Text], Field(min_length=1)] | None = None
    grammar: Text | None = Field(None, description="a grammar in llguidance's Lark dialect")
    json_object: bool | None = None
    whitespace_pattern: Any = refused()
    disable_any_whitespace: Any = refused(False)
    disable_additional_properties: Any = refused(False)
    structural_tag: Any = refused()


TokenId = Annotated[int, Field(ge=0), INTEGRAL]
Penalty = Annotated[float, Field(ge=-2, le=2)]
Bias = Annotated[float, Field(ge=-100, le=100)]
BiasKey = Annotated[str, Field(pattern="^[0-9]+$")]


class Sampling(Body):
    model_config = ConfigDict(json_schema_extra=state_rules)

    model: Text | None = Field(None, description="the served model (GET /v1/models)")
    max_tokens: Budget | None = Field(None, description=BUDGET)
    temperature: Temperature | None = Field(None, description=TEMPERATURE)
    top_p: TopP | None = Field(None, description=TOP_P)
    top_k: TopK | None = Field(None, description=TOP_K)
    seed: Seed | None = Field(None, description=SEED)
    stop: StopString | StopList | None = Field(None, description="text that ends the answer (not returned)")
    stream: bool = False
    stream_options: StreamOptions | None = Field(None, description="only with stream: true")
    n: Choices = Field(1, description="choices: n rows of the batch, a seed each derived from the request's")
    # what changes the tokens: serve/controls.py turns these into one RequestControls
    logit_bias: dict[BiasKey, Bias] | None = Field(None, description="token id (as a string) -> bias, -100..100")
    frequency_penalty: Penalty | None = Field(None, description="OpenAI's; -2..2, 0 = off")
    presence_penalty: Penalty | None = Field(None, description="OpenAI's; -2..2, 0 = off")
    repetition_penalty: Annotated[float, Field(gt=0)] | None = Field(None, description="vLLM's; 1 = off")
    min_p: Annotated[float, Field(ge=0, le=1)] | None = Field(None, description="vLLM's; 0 = off")
    min_tokens: Annotated[int, Field(ge=0), INTEGRAL] = Field(0, description="vLLM's: no EOS before this many")
    ignore_eos: bool = Field(False, description="vLLM's: EOS does not end the answer (max_tokens does)")
    stop_token_ids: list[TokenId] | None = Field(None, description="vLLM's: more token ids that end the answer")
    include_stop_str_in_output: bool = Field(False, description="vLLM's: return the stop string that ended the text")
    response_format: ResponseFormat | None = Field(None, description="text, json_object or json_schema")
    structured_outputs: StructuredOutputs | None = Field(None, description="vLLM's structured output")
    guided_json: dict[str, Any] | Text | None = Field(None, description="vLLM's legacy name: a JSON Schema")
    guided_regex: Text | None = Field(None, description="vLLM's legacy name: a regular expression")
    guided_choice: Annotated[list[Text], Field(min_length=1)] | None = Field(
        None, description="vLLM's legacy name: one of these strings"
    )
    guided_grammar: Text | None = Field(None, description="vLLM's legacy name: a grammar (llguidance's Lark)")
    # refused unless they ask for nothing
    tools: Any = refused()
    tool_choice: Any = refused("none")
    functions: Any = refused()
    function_call: Any = refused("none")
    echo: Any = refused(False)
    suffix: Any = refused("")
    best_of: Any = refused(1)
    use_beam_search: Any = refused(False)
    prompt_logprobs: Any = refused()
    logprob_token_ids: Any = refused()
    allowed_token_ids: Any = refused()
    bad_words: Any = refused([])
    skip_special_tokens: Any = refused(True)
    spaces_between_special_tokens: Any = refused(True)
    truncate_prompt_tokens: Any = refused()
    return_tokens_as_token_ids: Any = refused(False)
    return_token_ids: Any = refused(False)
    repetition_detection: Any = refused()
    watermarking: Any = refused(False)
    guided_whitespace_pattern: Any = refused()
    reasoning_effort: Any = refused()
    thinking_token_budget: Any = refused()
    vllm_xargs: Any = refused()


def any_text(schema: dict[str, Any]) -> None:
    """The prompt check's rule for a conversation, stated: some message holds some text."""
    text = {"type": "string", "pattern": NOT_BLANK}
    schema["contains"] = {
        "properties": {"content": {"anyOf": [text, {"type": "array", "contains": {"properties": {"text": text}}}]}}
    }


class ChatCompletionBody(Sampling):
    messages: list[ChatMessage] = Field(
        min_length=1, json_schema_extra=any_text, description="the conversation; some message must hold some text"
    )
    max_completion_tokens: Budget | None = Field(None, description=f"{BUDGET}; wins over max_tokens")
    logprobs: bool = False
    top_logprobs: TopLogprobs | None = Field(None, description="alternatives per token, with logprobs: true")
    add_generation_prompt: bool | None = Field(
        None, description="vLLM's: open the assistant's turn (default true; false with continue_final_message)"
    )
    tools: Annotated[list[ToolDef], Field(min_length=1)] | None = Field(
        None, description="functions the model may call (docs/serving.md: Tools)"
    )
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = Field(
        None, description="default auto with tools, none without (needs tools unless none)"
    )
    parallel_tool_calls: bool | None = Field(None, description="default true: several calls in one answer")
    continue_final_message: bool = Field(False, description="vLLM's: continue the last message, left open")
    add_special_tokens: Any = refused(False)
    chat_template: Any = refused()
    chat_template_kwargs: Any = refused({})
    documents: Any = refused([])


def _prompt_shape(value: Any) -> str:
    """Which of the prompt's four shapes a value is, so that its errors are that shape's (a union's branches would
    each report their own, and "at most 1 item" is no help for an id out of range)."""
    if not isinstance(value, list):
        return "one-text"
    if value and all(isinstance(v, str) for v in value):
        return "text-list"
    return "id-lists" if value and isinstance(value[0], list) else "token-ids"


class CompletionBody(Sampling):
    prompt: Annotated[
        Annotated[Prompt, Tag("one-text")]
        | Annotated[list[Prompt], Field(min_length=1, max_length=1), Tag("text-list")]
        | Annotated[list[TokenId], Field(min_length=1), Tag("token-ids")]
        | Annotated[
            list[Annotated[list[TokenId], Field(min_length=1)]], Field(min_length=1, max_length=1), Tag("id-lists")
        ],
        Discriminator(_prompt_shape),
    ] = Field(
        description="one text, not only white space, or its token ids; a list holds exactly one of either "
        "(send one request per prompt)"
    )
    logprobs: TopLogprobs | None = Field(None, description="the most likely tokens per position")
    add_special_tokens: Any = refused(True)
    prompt_embeds: Any = refused()


class TgiGrammar(Body):
    type: Literal["json", "regex"]
    value: dict[str, Any] | Text


class LmiParameters(Body):
    """SageMaker LMI (DJL Serving) / TGI `parameters`; LMI <= 0.31 samples only with do_sample."""

    max_new_tokens: Budget | None = Field(None, description=BUDGET)
    do_sample: bool | None = None
    temperature: Temperature | None = Field(None, description=TEMPERATURE)
    top_p: TopP | None = Field(None, description=TOP_P)
    top_k: TopK | None = Field(None, description=TOP_K)
    seed: Seed | None = Field(None, description=SEED)
    stop: StopList | None = Field(None, description="TGI's name for stop_sequences")
    stop_sequences: StopList | None = Field(None, description="text that ends the answer (not returned)")
    details: bool = False
    repetition_penalty: Annotated[float, Field(gt=0)] | None = Field(None, description="TGI's; 1 = off")
    frequency_penalty: Penalty | None = Field(None, description="TGI's; -2..2, 0 = off")
    grammar: TgiGrammar | None = Field(None, description="TGI's: a JSON Schema or a regular expression")
    typical_p: Any = refused()
    truncate: Any = refused()
    return_full_text: Any = refused(False)
    decoder_input_details: Any = refused(False)
    top_n_tokens: Any = refused()
    best_of: Any = refused(1)
    watermark: Any = refused(False)
    adapter_id: Any = refused()


class LmiBody(Body):
    inputs: Prompt = Field(description="the raw text, not only white space")
    parameters: LmiParameters = LmiParameters()
    stream: bool = False


def chat_turns(messages: list[ChatMessage]) -> tuple[list[Turn], list[Problem]]:
    """The conversation as messages for the chat template (`developer` as `system`), and the messages without text
    or calls."""
    problems = [
        Problem(
            f"messages.{i}.content",
            None,
            "required: the message's text (only an assistant message with tool_calls may leave it out)",
            "send content as a string or a list of text parts",
        )
        for i, m in enumerate(messages)
        if m.content is None and not (m.role == "assistant" and m.tool_calls)
    ]
    turns = [
        Turn(
            "system" if m.role == "developer" else m.role,
            m.content if isinstance(m.content, str) or m.content is None else "".join(p.text for p in m.content),
            list(m.tool_calls or []) if m.role == "assistant" else [],
            m.tool_call_id if m.role == "tool" else None,
        )
        for m in messages
    ]
    return turns, problems


INVOCATION_BODIES: dict[str, type[BaseModel]] = {
    "inputs": LmiBody,
    "messages": ChatCompletionBody,
    "prompt": CompletionBody,
}  # in this order


def dependency_problems(body: Sampling) -> list[Problem]:
    """The rules between fields (DEPENDS_ON)."""
    return [
        Problem(
            name,
            value.model_dump() if isinstance(value, BaseModel) else value,
            f"only allowed with {other}: true (OpenAI's and vLLM's rule)",
            f"send {other}: true with it, or leave {name} out",
        )
        for name, other in _dependencies(type(body))
        if (value := getattr(body, name)) is not None and getattr(body, other) is not True
    ]


def refusals(body: BaseModel, prefix: str = "", rule: str | None = None) -> list[Problem]:
    """The fields of `body` this server refuses rather than ignores, where they ask for something."""
    return [
        Problem(
            prefix + name,
            value,
            rule or REFUSAL_RULES.get(name, NOT_SUPPORTED),
            f"leave {prefix + name} out",
        )
        for name, passing in refused_fields(type(body)).items()
        if (value := getattr(body, name)) is not None and not any(_same(value, ok) for ok in passing)
    ]


def _same(value: Any, ok: Any) -> bool:
    """JSON equality: 0 == 0.0, but false is not 0."""
    return value == ok and isinstance(value, bool) == isinstance(ok, bool)
