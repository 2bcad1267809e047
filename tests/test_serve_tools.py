"""Tools as Llama-3.1-style JSON calls (serve/tool_calls.py), through the official openai client against a real
server on 127.0.0.1: calls read from the answer, streamed as delta.tool_calls, the constraint each tool_choice asks
for (compiled by llguidance on a real tokenizer), and the tools rendered by the template or by the server."""

from __future__ import annotations

import json

import httpx
import pytest
from serve_support import FakePipeline, running_server
from tokenizer_support import byte_level_tokenizer

from neuron_ssp.serve.tool_calls import Tool, ToolUse, read_calls
from neuron_ssp.speculation.grammar import GrammarCompiler

openai = pytest.importorskip("openai")

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
ASK = [{"role": "user", "content": "Weather in Paris?"}]
CALL = '{"name": "get_weather", "parameters": {"city": "Paris"}}'


def client(url: str):
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def test_a_call_in_the_answer_is_a_tool_call_with_finish_reason_tool_calls():
    pipeline = FakePipeline(n_positions=4096, reply=f"{CALL}; " + CALL.replace("Paris", "Rome"))
    with running_server(pipeline) as url:
        reply = client(url).chat.completions.create(model="fake-model", messages=ASK, tools=[WEATHER, TIME])
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    calls = choice.message.tool_calls
    assert [(c.type, c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("function", "get_weather", {"city": "Paris"}),
        ("function", "get_weather", {"city": "Rome"}),
    ]
    assert all(c.id.startswith("chatcmpl-tool-") for c in calls) and calls[0].id != calls[1].id
    assert pipeline.calls[-1]["controls"].grammar is None  # auto without a strict tool: read, not constrained


def test_text_stays_text_and_text_around_calls_is_the_content():
    with running_server(FakePipeline(n_positions=4096, reply="It is sunny.")) as url:
        text = client(url).chat.completions.create(model="fake-model", messages=ASK, tools=[WEATHER])
    with running_server(FakePipeline(n_positions=4096, reply=f"Let me look. {CALL}")) as url:
        both = client(url).chat.completions.create(model="fake-model", messages=ASK, tools=[WEATHER])
    with running_server(FakePipeline(n_positions=4096, reply='{"name": "unknown_tool", "parameters": {}}')) as url:
        unknown = client(url).chat.completions.create(model="fake-model", messages=ASK, tools=[WEATHER])
    assert (text.choices[0].message.content, text.choices[0].message.tool_calls) == ("It is sunny.", None)
    assert text.choices[0].finish_reason == "stop"
    assert both.choices[0].message.content == "Let me look." and len(both.choices[0].message.tool_calls) == 1
    assert unknown.choices[0].message.tool_calls is None and "unknown_tool" in unknown.choices[0].message.content


def test_streamed_calls_arrive_as_delta_tool_calls_with_index_then_arguments():
    pipeline = FakePipeline(n_positions=4096, reply=f"{CALL}; " + CALL.replace("Paris", "Rome"))
    with running_server(pipeline) as url:
        chunks = list(
            client(url).chat.completions.create(model="fake-model", messages=ASK, tools=[WEATHER], stream=True)
        )
        whole = client(url).chat.completions.create(model="fake-model", messages=ASK, tools=[WEATHER])
    deltas = [c.choices[0].delta.tool_calls for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    assert [len(d) for d in deltas] == [1, 1, 1, 1]
    first, arguments = deltas[0][0], deltas[1][0]
    assert (first.index, first.type, first.function.name, first.function.arguments) == (
        0,
        "function",
        "get_weather",
        None,
    )
    assert first.id.startswith("chatcmpl-tool-") and arguments.index == 0 and arguments.id is None
    assert json.loads(arguments.function.arguments) == {"city": "Paris"} and deltas[2][0].index == 1
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert not any(c.choices[0].delta.content for c in chunks if c.choices)
    assert [d[0].function.arguments for d in deltas[1::2]] == [
        c.function.arguments for c in whole.choices[0].message.tool_calls
    ]


def test_a_streamed_answer_that_is_not_a_call_streams_as_text():
    with running_server(FakePipeline(n_positions=4096, reply="No tool needed.")) as url:
        chunks = list(
            client(url).chat.completions.create(model="fake-model", messages=ASK, tools=[WEATHER], stream=True)
        )
    with running_server(FakePipeline(n_positions=4096, reply="{not a call at all")) as url:
        broken = list(
            client(url).chat.completions.create(model="fake-model", messages=ASK, tools=[WEATHER], stream=True)
        )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "No tool needed."
    assert "".join(c.choices[0].delta.content or "" for c in broken if c.choices) == "{not a call at all"
    assert [c.choices[0].finish_reason for c in broken if c.choices][-1] == "stop"


@pytest.mark.parametrize(
    "choice, parallel, strict, field, starts",
    [
        ("required", True, False, "tool_choice", 'start: calls\ncalls: call ("; " call)*'),
        ("required", False, False, "tool_choice", "start: calls\ncalls: call\n"),
        (
            {"type": "function", "function": {"name": "get_time"}},
            True,
            False,
            "tool_choice",
            "start: calls\ncalls: call\n",
        ),
        ("auto", True, True, "tools", 'start: calls | text\ncalls: call ("; " call)*'),
        ("auto", True, False, None, None),
        ("none", True, True, None, None),
    ],
)
def test_each_tool_choice_asks_for_its_constraint(choice, parallel, strict, field, starts):
    strict_weather = {**WEATHER, "function": {**WEATHER["function"], "strict": strict}}
    pipeline = FakePipeline(n_positions=4096, reply="ok")
    with running_server(pipeline) as url:
        body = {
            "messages": ASK,
            "tools": [strict_weather, TIME],
            "tool_choice": choice,
            "parallel_tool_calls": parallel,
        }
        r = httpx.post(f"{url}/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    grammar = pipeline.calls[-1]["controls"].grammar
    assert (grammar.field, grammar.source[: len(starts)]) == (field, starts) if field else grammar is None
    if isinstance(choice, dict):
        assert '"get_time"' in grammar.source and '"get_weather"' not in grammar.source
        assert r.json()["choices"][0]["finish_reason"] == "stop"


def matches(compiler: GrammarCompiler, use: ToolUse, text: str) -> bool:
    matcher = compiler.compile(use.grammar()).matcher.deep_copy()
    return matcher.consume_tokens(compiler_tokens(text)) and matcher.is_accepting()


def compiler_tokens(text: str) -> list[int]:
    return TOKENIZER(text, add_special_tokens=False)["input_ids"]


TOKENIZER = byte_level_tokenizer()


@pytest.mark.parametrize(
    "choice, parallel, text, accepted",
    [
        ("required", True, CALL, True),
        ("required", True, f"{CALL}; {CALL}", True),
        ("required", False, f"{CALL}; {CALL}", False),
        ("required", True, "It is sunny.", False),
        ("required", True, '{"name": "get_weather", "parameters": {"town": "Paris"}}', False),
        ("get_time", True, '{"name": "get_time", "parameters": {}}', True),
        ("get_time", True, CALL, False),
        ("auto", True, "It is sunny.", True),
        ("auto", True, CALL, True),
        ("auto", True, '{"name": "get_weather", "parameters": {"town": "Paris"}}', False),
    ],
)
def test_the_constraints_compile_on_a_real_tokenizer_and_take_exactly_their_calls(choice, parallel, text, accepted):
    weather = Tool("get_weather", None, WEATHER["function"]["parameters"], strict=True)
    clock = Tool("get_time", None, {"type": "object", "properties": {}, "additionalProperties": False}, strict=False)
    use = ToolUse((weather, clock), choice, parallel)
    compiler = GrammarCompiler(TOKENIZER, {TOKENIZER.eos_token_id or 0}, len(TOKENIZER))
    assert compiler.problems(use.grammar()) == []
    assert matches(compiler, use, text) == accepted
    if accepted and text.startswith("{"):
        assert [c.name for c in read_calls(text, use)[0]] == [json.loads(text.split("; ")[0])["name"]] * text.count(
            '"name"'
        )


def test_the_server_renders_tools_and_the_conversation_for_a_template_without_tools():
    pipeline = FakePipeline(n_positions=4096, reply="ok")  # characters as tokens, no template: the turns, one a line
    history = [
        {"role": "system", "content": "Be brief."},
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "18 C"},
    ]
    with running_server(pipeline) as url:
        r = httpx.post(f"{url}/v1/chat/completions", json={"messages": history, "tools": [WEATHER]})
        prompt = "".join(chr(int(i)) for i in pipeline.calls[-1]["prompt_ids"])
        httpx.post(f"{url}/v1/chat/completions", json={"messages": history, "tools": [WEATHER], "tool_choice": "none"})
        without = "".join(chr(int(i)) for i in pipeline.calls[-1]["prompt_ids"])
    assert r.status_code == 200, r.text
    lines = prompt.split("\n")
    assert (
        lines[0].startswith("You can call these functions.") and "Answer in text when none of them helps." in lines[0]
    )
    assert json.loads(lines[2]) == WEATHER["function"] and lines[3:5] == ["", "Be brief."]
    assert lines[-2:] == ['{"name": "get_weather", "parameters": {"city": "Paris"}}', "Result of get_weather: 18 C"]
    assert "You can call" not in without and "Result of get_weather: 18 C" in without


def test_a_template_that_renders_tools_gets_them_and_the_calls_as_they_are():
    tokenizer = byte_level_tokenizer()
    tokenizer.chat_template = (
        "{% if tools %}[TOOLS]{{ tools | tojson }}\n{% endif %}{% for m in messages %}[{{ m.role }}]"
        "{% if m.tool_calls %}[CALLS]{{ m.tool_calls | tojson }}{% else %}{{ m.content }}{% endif %}\n{% endfor %}"
    )
    pipeline = FakePipeline(n_positions=4096, reply="ok", tokenizer=tokenizer)
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    history = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "18 C"},
    ]
    with running_server(pipeline) as url:
        r = httpx.post(f"{url}/v1/chat/completions", json={"messages": history, "tools": [WEATHER]})
    prompt = tokenizer.decode(pipeline.calls[-1]["prompt_ids"].tolist())
    assert r.status_code == 200 and pipeline.template_renders_tools
    assert prompt.startswith("[TOOLS]") and '"get_weather"' in prompt.split("\n")[0] and "You can call" not in prompt
    assert '[assistant][CALLS][{"id": "c1"' in prompt and '"arguments": {"city": "Paris"}' in prompt
    assert "[tool]18 C" in prompt


@pytest.mark.parametrize(
    "body, param, words",
    [
        ({"tool_choice": "required"}, "tool_choice", ["needs tools"]),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice.function.name",
            ["not one of the tools"],
        ),
        (
            {"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}},
            "response_format, tool_choice",
            ["one structured-output constraint"],
        ),
        ({"tools": []}, "tools", ["at least 1"]),
        ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools.0.function.name", []),
        ({"functions": [{"name": "f"}]}, "functions", ["deprecated", "tools and tool_choice"]),
        ({"messages": [*ASK, {"role": "assistant", "content": None}]}, "messages.1.content", ["required"]),
    ],
)
def test_bad_tool_requests_are_a_400_naming_the_field(body, param, words):
    with running_server(FakePipeline(n_positions=4096)) as url:
        r = httpx.post(f"{url}/v1/chat/completions", json={"messages": ASK, **body})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    assert all(word in r.json()["error"]["message"] for word in words), r.text


def test_tools_on_completions_are_refused_as_chat_only():
    with running_server(FakePipeline(n_positions=4096)) as url:
        r = httpx.post(f"{url}/v1/completions", json={"prompt": "x", "tools": [WEATHER]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools" and "/v1/chat/completions" in r.text
