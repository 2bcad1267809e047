"""Tools: OpenAI's `tools`, `tool_choice` and `parallel_tool_calls` as Llama-3.1-style JSON tool calls.

A call is the JSON object `{"name": <function>, "parameters": <arguments>}`, several separated by "; " (the format
Llama 3.1's JSON tool calling uses, and vLLM's `llama3_json` tool parser reads, `arguments` accepted for
`parameters`: vllm/tool_parsers/llama_tool_parser.py at 13e48c2b).

Rendering. Where the model's chat template renders tools (transformers passes `tools=` to it; `renders_tools`
checks whether the output changes), the tools, the assistant messages' `tool_calls` and the `tool` messages go to the
template as they are. Otherwise (SmolLM2's template ignores them) the server renders them itself: a system message
(its own, or the first one with the tools' text put before it) says how to call and lists each function as JSON; an
assistant message's calls become its text, in the call format; a tool message becomes a user message
"Result of <function>: <content>". With `tool_choice: "none"` the tools are left out of the prompt, as vLLM does
with --exclude-tools-when-tool-choice-none, and the answer is text.

Constraint (a grammar in llguidance's Lark dialect, each call's object a %json schema): `required` asks for one call
or more of any tool, a named function for one call of it, and `auto` for text or calls when some tool is `strict`
(a strict tool's arguments follow its `parameters` schema; another's are any object). `auto` without a strict tool
is not constrained: its answer is parsed. `parallel_tool_calls: false` allows one call.

Answer. The text is read as calls when it holds JSON objects and each one is a call of a known tool; text around
them is the message's `content` (None when there is none), and `finish_reason` is "tool_calls" (a named function's
is "stop", as OpenAI and vLLM answer a forced call). Each call gets an id `chatcmpl-tool-<32 hex>` (vLLM's) and its
arguments as JSON text. Streamed, an answer that starts with "{" is held back and each call is sent when its object
is complete, as vLLM's stream sends them: a delta with the call's index, id, type and name, then one with its
arguments; an answer that starts otherwise streams as text.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import Field

from neuron_ssp.errors import Problem
from neuron_ssp.serve.fields import Body, Text
from neuron_ssp.speculation.controls import Grammar

FUNCTION_NAME = "^[a-zA-Z0-9_-]{1,64}$"  # OpenAI's rule for a function's name
CALL_SEPARATOR = "; "
# what llguidance's JSON takes besides the schema: the separators json.dumps writes, no free white space
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class FunctionDef(Body):
    name: Annotated[str, Field(pattern=FUNCTION_NAME)]
    description: Text | None = None
    parameters: dict[str, Any] | None = Field(None, description="a JSON Schema for the arguments")
    strict: bool | None = Field(None, description="with tool_choice auto, the answer is constrained to text or calls")


class ToolDef(Body):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(Body):
    name: Annotated[str, Field(pattern=FUNCTION_NAME)]


class NamedToolChoice(Body):
    type: Literal["function"]
    function: NamedFunction


class CalledFunction(Body):
    name: Text
    arguments: Text = Field(description="the arguments as JSON text")


class CallIn(Body):
    """A call an assistant message made (it comes back in the conversation)."""

    id: Text | None = None
    type: Literal["function"] = "function"
    function: CalledFunction


@dataclass(frozen=True)
class Tool:
    name: str
    description: str | None
    parameters: dict[str, Any]  # a JSON Schema; {"type": "object"} when the request gave none
    strict: bool

    def definition(self) -> dict[str, Any]:
        """The tool as OpenAI writes it (what transformers passes to a chat template)."""
        described = {"description": self.description} if self.description else {}
        return {"type": "function", "function": {"name": self.name, **described, "parameters": self.parameters}}

    def call_schema(self, constrained: bool) -> dict[str, Any]:
        """The JSON Schema of one call of this tool: its arguments follow `parameters` when `constrained`."""
        arguments = self.parameters if constrained else {"type": "object"}
        return {
            "type": "object",
            "properties": {"name": {"const": self.name}, "parameters": arguments},
            "required": ["name", "parameters"],
            "additionalProperties": False,
        }


@dataclass(frozen=True)
class ToolUse:
    """A request's tools and what it lets the model do with them."""

    tools: tuple[Tool, ...]
    choice: str  # "none" | "auto" | "required" | the name of the one function to call
    parallel: bool = True

    @property
    def named(self) -> bool:
        return self.choice not in ("none", "auto", "required")

    @property
    def parsed(self) -> bool:
        """Whether the answer is read as calls."""
        return self.choice != "none"

    def grammar(self) -> Grammar | None:
        """The constraint on the answer, or None (tool_choice none, or auto without a strict tool)."""
        if self.choice == "none" or (self.choice == "auto" and not any(t.strict for t in self.tools)):
            return None
        callable_tools = [t for t in self.tools if not self.named or t.name == self.choice]
        calls = [t.call_schema(constrained=t.strict or self.choice != "auto") for t in callable_tools]
        schema = {"anyOf": calls} if len(calls) > 1 else calls[0]
        call = "call: %json " + json.dumps({**schema, "x-guidance": JSON_LAYOUT})
        sequence = f'calls: call ("{CALL_SEPARATOR}" call)*' if self.parallel and not self.named else "calls: call"
        if self.choice == "auto":  # text that cannot start a call, or calls
            lark = f"start: calls | text\n{sequence}\n{call}\ntext: /[^{{](.|\\n)*/ |\n"
        else:
            lark = f"start: calls\n{sequence}\n{call}\n"
        return Grammar("lark", lark, "tool_choice" if self.choice != "auto" else "tools")

    def system_prompt(self) -> str:
        """How to call the tools, and each tool as JSON: the server's own rendering, for templates without tools."""
        several = f' To call several, separate the objects with "{CALL_SEPARATOR}".' if self.parallel else ""
        must = (
            f"You must call the function {self.choice}."
            if self.named
            else "You must call one of them."
            if self.choice == "required"
            else "Answer in text when none of them helps."
        )
        listed = "\n".join(json.dumps(t.definition()["function"], ensure_ascii=False) for t in self.tools)
        return (
            "You can call these functions. To call one, answer with only a JSON object "
            '{"name": <function name>, "parameters": <object of argument names and values>}.'
            f"{several} {must}\n\n{listed}"
        )


def tool_use(
    tools: list[ToolDef] | None, choice: str | NamedToolChoice | None, parallel: bool | None
) -> tuple[ToolUse | None, list[Problem]]:
    """The request's ToolUse (None without tools), and the problems of its fields: a tool_choice without tools
    (other than none), a named function that is not among the tools."""
    problems: list[Problem] = []
    chosen = choice.function.name if isinstance(choice, NamedToolChoice) else choice
    if not tools:
        if chosen not in (None, "none"):
            problems.append(
                Problem(
                    "tool_choice",
                    chosen,
                    "needs tools to choose from (OpenAI's and vLLM's rule)",
                    "send tools with it, or leave tool_choice out",
                )
            )
        return None, problems
    names = [t.function.name for t in tools]
    if isinstance(choice, NamedToolChoice) and chosen not in names:
        problems.append(
            Problem(
                "tool_choice.function.name",
                chosen,
                f"not one of the tools: {', '.join(names)}",
                "name a function from tools",
            )
        )
    defined = tuple(
        Tool(f.name, f.description, f.parameters or {"type": "object"}, bool(f.strict))
        for f in (t.function for t in tools)
    )
    use = ToolUse(defined, chosen or "auto", parallel is not False)  # auto: OpenAI's and vLLM's default with tools
    return use, problems


@dataclass
class Turn:
    """One message as it reaches the chat template: role and text, and the calls it made or answers."""

    role: str
    content: str | None
    calls: list[CallIn] = field(default_factory=list)
    call_id: str | None = None


def conversation(
    turns: list[Turn], use: ToolUse | None, template_renders_tools: bool
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """The messages for the chat template, and the tools to pass it (None: none, or the server rendered them)."""
    offered = use is not None and use.choice != "none"
    if template_renders_tools:
        messages = [_native(t) for t in turns]
        return messages, [t.definition() for t in use.tools] if offered and use else None
    names = {c.id: c.function.name for t in turns for c in t.calls if c.id}
    messages = [_rendered(t, names) for t in turns]
    if offered and use:
        prompt = use.system_prompt()
        if messages and messages[0]["role"] == "system":
            messages[0] = {"role": "system", "content": f"{prompt}\n\n{messages[0]['content']}"}
        else:
            messages.insert(0, {"role": "system", "content": prompt})
    return messages, None


def _native(turn: Turn) -> dict[str, Any]:
    """A message in the form transformers' chat templates read (arguments as an object where they parse)."""
    message: dict[str, Any] = {"role": turn.role, "content": turn.content or ""}
    if turn.calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": _loaded(c)}}
            for c in turn.calls
        ]
    if turn.call_id is not None:
        message["tool_call_id"] = turn.call_id
    return message


def _loaded(call: CallIn) -> Any:
    try:
        return json.loads(call.function.arguments)
    except json.JSONDecodeError:
        return call.function.arguments


def _rendered(turn: Turn, names: dict[str, str]) -> dict[str, Any]:
    """A message as the server renders it for a template that knows no tools."""
    if turn.role == "tool":
        name = names.get(turn.call_id or "")
        return {"role": "user", "content": f"Result of {name}: {turn.content}" if name else f"Result: {turn.content}"}
    if turn.calls:
        calls = CALL_SEPARATOR.join(
            json.dumps({"name": c.function.name, "parameters": _loaded(c)}, ensure_ascii=False) for c in turn.calls
        )
        return {"role": turn.role, "content": f"{turn.content}\n{calls}" if turn.content else calls}
    return {"role": turn.role, "content": turn.content or ""}


@dataclass(frozen=True)
class ToolCall:
    """A call read from the answer."""

    id: str
    name: str
    arguments: str  # JSON text

    def body(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def read_calls(text: str, use: ToolUse) -> tuple[list[ToolCall], str | None]:
    """The calls in an answer and the text around them, or ([], text) when the answer is not calls: it holds no JSON
    object, or one that is not a call of a known tool (vLLM's llama3_json rule, with the tool names checked)."""
    found, between, position = [], [], 0
    decoder = json.JSONDecoder()
    while (start := text.find("{", position)) >= 0:
        try:
            obj, end = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            return [], text
        call = _call(obj, use)
        if call is None:
            return [], text
        found.append(call)
        between.append(text[position:start])
        position = end
    if not found:
        return [], text
    # the text before the first call and after the last one; between two calls, all but their separator
    kept = [between[0], *(s for s in between[1:] if s.strip() not in ("", CALL_SEPARATOR.strip())), text[position:]]
    around = " ".join(s.strip() for s in kept if s.strip())
    return found, around or None


def _call(obj: Any, use: ToolUse) -> ToolCall | None:
    if not isinstance(obj, dict) or obj.get("name") not in {t.name for t in use.tools}:
        return None
    arguments = obj.get("parameters", obj.get("arguments"))
    if not isinstance(arguments, dict):
        return None
    return ToolCall(f"chatcmpl-tool-{uuid.uuid4().hex}", obj["name"], json.dumps(arguments, ensure_ascii=False))


def finish_reason(use: ToolUse, calls: list[ToolCall], reason: str) -> str:
    """ "tool_calls" when the answer called tools, except for a named function (OpenAI's and vLLM's "stop")."""
    return "tool_calls" if calls and not use.named else reason


class CallStream:
    """A streamed answer read as calls: it holds back text that starts with "{" and gives out each call when its
    object is complete; text that starts otherwise passes as it comes."""

    def __init__(self, use: ToolUse):
        self.use = use
        self.held = ""
        self.calling: bool | None = None  # None until the first character that is not white space
        self.calls: list[ToolCall] = []
        self.read = 0  # characters of `held` already read as calls

    def add(self, text: str) -> tuple[str, list[ToolCall]]:
        """Text to send as content now, and the calls completed by `text`."""
        if self.calling is False:
            return text, []
        self.held += text
        if self.calling is None:
            stripped = self.held.lstrip()
            if not stripped:
                return "", []
            self.calling = stripped.startswith("{")
            if not self.calling:
                out, self.held = self.held, ""
                return out, []
        return "", self._complete()

    def finish(self) -> str:
        """At the end: what was held back and is not a call (sent as content)."""
        if not self.calling:
            return ""
        rest = self.held[self.read :]
        return "" if not rest.strip() else (rest if self.calls else self.held)

    def _complete(self) -> list[ToolCall]:
        done = []
        decoder = json.JSONDecoder()
        while (start := self.held.find("{", self.read)) >= 0:
            try:
                obj, end = decoder.raw_decode(self.held, start)
            except json.JSONDecodeError:
                break
            call = _call(obj, self.use)
            if call is None:
                break
            done.append(call)
            self.read = end
        self.calls += done
        return done
