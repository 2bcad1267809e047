"""Fields that change the answer are honoured or refused with a 400 naming them, never ignored (issue 46 items
7-10): vLLM's sampling extras and structured output become one RequestControls that the pipeline runs or refuses;
the chat template's switches, the developer role, token-id prompts and the text-level include_stop_str_in_output
are the server's own."""

from __future__ import annotations

import httpx
import pytest
from serve_support import FakePipeline, running_server
from tokenizer_support import byte_level_tokenizer

from neuron_ssp.speculation.controls import Grammar, RequestControls

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hello"}]}
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# field -> (a value that asks for something, what the request's RequestControls must then hold)
CONTROLS = {
    "ignore_eos": (True, RequestControls(ignore_eos=True)),
    "min_tokens": (2, RequestControls(min_tokens=2)),
    "repetition_penalty": (1.2, RequestControls(repetition_penalty=1.2)),
    "min_p": (0.1, RequestControls(min_p=0.1)),
    "stop_token_ids": ([65, 66], RequestControls(stop_token_ids=(65, 66))),
    "logit_bias": ({"65": -100, "7": 2.5}, RequestControls(logit_bias=((65, -100.0), (7, 2.5)))),
    "presence_penalty": (0.5, RequestControls(presence_penalty=0.5)),
    "frequency_penalty": (-0.5, RequestControls(frequency_penalty=-0.5)),
    "guided_json": (
        {"type": "object", "properties": {"a": {"type": "integer"}}},
        RequestControls(
            grammar=Grammar(
                "json_schema", '{"type": "object", "properties": {"a": {"type": "integer"}}}', "guided_json"
            )
        ),
    ),
    "guided_choice": (["yes", "no"], RequestControls(grammar=Grammar("choice", '["yes", "no"]', "guided_choice"))),
    "guided_regex": ("[0-9]+", RequestControls(grammar=Grammar("regex", "[0-9]+", "guided_regex"))),
    "guided_grammar": ('start: "a"', RequestControls(grammar=Grammar("lark", 'start: "a"', "guided_grammar"))),
    "structured_outputs": (
        {"json": '{"type": "string"}'},
        RequestControls(grammar=Grammar("json_schema", '{"type": "string"}', "structured_outputs.json")),
    ),
    "response_format": (
        {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "array"}, "strict": True}},
        RequestControls(grammar=Grammar("json_schema", '{"type": "array"}', "response_format")),
    ),
}
PARAM = {"structured_outputs": "structured_outputs.json"}  # where the 400 points: the constraint's own field


def template_pipeline(**kwargs) -> FakePipeline:
    """The stand-in with a real tokenizer and a ChatML template: its calls record the rendered prompt's ids."""
    tokenizer = byte_level_tokenizer()
    tokenizer.chat_template = CHATML
    return FakePipeline(reply="ok", tokenizer=tokenizer, **kwargs)


def rendered(pipeline: FakePipeline) -> str:
    return pipeline.tokenizer.decode(pipeline.calls[-1]["prompt_ids"].tolist())


@pytest.mark.parametrize("field", CONTROLS)
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_an_engine_that_samples_on_the_device_refuses_each_control_naming_it(field, path):
    body = CHAT if "chat" in path else {"prompt": "hello"}
    pipeline = FakePipeline(engine="fused")
    with running_server(pipeline) as url:
        r = httpx.post(f"{url}{path}", json={**body, field: CONTROLS[field][0], "max_tokens": 8})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == PARAM.get(field, field) and not pipeline.calls


@pytest.mark.parametrize("field", CONTROLS)
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_a_control_reaches_the_loop_as_request_controls(field, path):
    body = CHAT if "chat" in path else {"prompt": "hello"}
    pipeline = FakePipeline()
    with running_server(pipeline) as url:
        r = httpx.post(f"{url}{path}", json={**body, field: CONTROLS[field][0], "max_tokens": 8})
    assert r.status_code == 200, r.text
    assert pipeline.calls[-1]["controls"] == CONTROLS[field][1]


def test_every_refused_field_is_listed_in_one_400():
    structured = ("guided", "response", "structured")  # one constraint a request: guided_regex below
    asked = {field: value for field, (value, _) in CONTROLS.items() if not field.startswith(structured)}
    asked.update(chat_template="{{ messages }}", echo=True, guided_regex="a+")
    with running_server(FakePipeline(engine="fused")) as url:
        r = httpx.post(f"{url}/v1/chat/completions", json={**CHAT, **asked, "max_tokens": 8})
    assert r.status_code == 400
    lines = r.json()["error"]["message"].split("\n")
    named = {line.split(" = ")[0] for line in lines}
    assert named == {PARAM.get(f, f) for f in asked}, lines
    assert any("--trust-request-chat-template" in line for line in lines if line.startswith("chat_template"))


def test_two_structured_output_constraints_are_one_400_naming_both():
    with running_server(FakePipeline()) as url:
        r = httpx.post(
            f"{url}/v1/chat/completions",
            json={**CHAT, "guided_regex": "a", "response_format": {"type": "json_object"}},
        )
        no_schema = httpx.post(f"{url}/v1/chat/completions", json={**CHAT, "response_format": {"type": "json_schema"}})
        two_kinds = httpx.post(
            f"{url}/v1/chat/completions", json={**CHAT, "structured_outputs": {"regex": "a", "choice": ["b"]}}
        )
        bad_json = httpx.post(f"{url}/v1/chat/completions", json={**CHAT, "guided_json": "{not json"})
        text = httpx.post(f"{url}/v1/chat/completions", json={**CHAT, "response_format": {"type": "text"}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format, guided_regex"
    assert no_schema.status_code == 400 and no_schema.json()["error"]["param"] == "response_format.json_schema.schema"
    assert two_kinds.status_code == 400 and "exactly one of" in two_kinds.json()["error"]["message"]
    assert bad_json.status_code == 400 and "not valid JSON" in bad_json.json()["error"]["message"]
    assert text.status_code == 200


def test_min_tokens_above_the_budget_is_refused_as_vllm_does():
    with running_server(FakePipeline()) as url:
        r = httpx.post(f"{url}/v1/completions", json={"prompt": "x", "min_tokens": 9, "max_tokens": 8})
    assert r.status_code == 400 and r.json()["error"]["param"] == "min_tokens"
    assert "max_tokens = 8" in r.json()["error"]["message"]


@pytest.mark.parametrize("include", [False, True])
def test_include_stop_str_in_output_keeps_the_stop_string(include):
    with running_server(FakePipeline(reply="hello world, again")) as url:
        body = {"prompt": "x", "stop": [" again", ", "], "include_stop_str_in_output": include}
        r = httpx.post(f"{url}/v1/completions", json=body)
        streamed = httpx.post(f"{url}/v1/completions", json={**body, "stream": True})
    text = r.json()["choices"][0]["text"]
    assert text == ("hello world, " if include else "hello world")
    chunks = [line for line in streamed.text.split("\n\n") if line.startswith("data: {")]
    assert "".join(__import__("json").loads(c[6:])["choices"][0]["text"] for c in chunks) == text


def test_continue_final_message_and_add_generation_prompt_shape_the_rendered_prompt():
    pipeline = template_pipeline()
    prefill = [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "The colour is"}]
    with running_server(pipeline) as url:
        httpx.post(f"{url}/v1/chat/completions", json=CHAT)
        opened = rendered(pipeline)
        httpx.post(f"{url}/v1/chat/completions", json={**CHAT, "add_generation_prompt": False})
        closed = rendered(pipeline)
        httpx.post(f"{url}/v1/chat/completions", json={**CHAT, "messages": prefill, "continue_final_message": True})
        continued = rendered(pipeline)
        both = httpx.post(
            f"{url}/v1/chat/completions",
            json={**CHAT, "continue_final_message": True, "add_generation_prompt": True},
        )
    assert opened.endswith("<|im_end|>\n<|im_start|>assistant\n")
    assert closed.endswith("hello<|im_end|>\n")
    assert continued.endswith("<|im_start|>assistant\nThe colour is")
    assert both.status_code == 400 and both.json()["error"]["param"] == "add_generation_prompt"


def test_the_developer_role_is_rendered_as_system():
    pipeline = template_pipeline()
    with running_server(pipeline) as url:
        messages = [{"role": "developer", "content": "Answer in French."}, {"role": "user", "content": "Hi"}]
        r = httpx.post(f"{url}/v1/chat/completions", json={**CHAT, "messages": messages})
    assert r.status_code == 200
    assert rendered(pipeline).startswith(
        "<|im_start|>system\nAnswer in French.<|im_end|>"
    ) and "developer" not in rendered(pipeline)


@pytest.mark.parametrize("prompt, ids", [([504, 3575, 282], [504, 3575, 282]), ([[7, 8]], [7, 8])])
def test_a_prompt_of_token_ids_is_taken_as_it_is(prompt, ids):
    pipeline = FakePipeline(reply="ok")
    with running_server(pipeline) as url:
        r = httpx.post(f"{url}/v1/completions", json={"prompt": prompt, "max_tokens": 4})
    assert r.status_code == 200, r.text
    assert pipeline.calls[-1]["prompt_ids"].tolist() == ids and r.json()["usage"]["prompt_tokens"] == len(ids)


@pytest.mark.parametrize(
    "prompt, param, words",
    [
        ([5, 0x110000, 0x110001], "prompt.1", ["0..1114111", "1 more lie outside it too, at indices [2]"]),
        ([[5, 0x110000]], "prompt.0.1", ["0..1114111"]),
        ([5, -1], "prompt.1", [">= 0"]),
        ([5, "x"], "prompt.1", ["must be an integer"]),
        ([], "prompt", ["at least 1"]),
        ([[1], [2]], "prompt", ["at most 1"]),
    ],
)
def test_token_ids_outside_the_vocabulary_are_a_400_naming_the_index(prompt, param, words):
    with running_server(FakePipeline()) as url:
        r = httpx.post(f"{url}/v1/completions", json={"prompt": prompt})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    assert all(word in r.json()["error"]["message"] for word in words), r.text


def test_a_message_without_content_or_tool_calls_names_its_content():
    with running_server(FakePipeline()) as url:
        r = httpx.post(f"{url}/v1/chat/completions", json={**CHAT, "messages": [*CHAT["messages"], {"role": "user"}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages.1.content"


def test_tgi_parameters_that_change_the_answer_are_honoured_or_refused():
    lmi = {"inputs": "hello", "parameters": {"max_new_tokens": 4}}
    asks = {
        "repetition_penalty": (1.3, RequestControls(repetition_penalty=1.3)),
        "frequency_penalty": (0.4, RequestControls(frequency_penalty=0.4)),
        "grammar": (
            {"type": "regex", "value": "[a-z]+"},
            RequestControls(grammar=Grammar("regex", "[a-z]+", "parameters.grammar")),
        ),
    }
    for runs in (False, True):
        pipeline = FakePipeline(engine="native" if runs else "fused")
        with running_server(pipeline) as url:
            for name, (value, controls) in asks.items():
                r = httpx.post(f"{url}/invocations", json={**lmi, "parameters": {**lmi["parameters"], name: value}})
                if runs:
                    assert r.status_code == 200 and pipeline.calls[-1]["controls"] == controls, r.text
                else:
                    assert r.status_code == 400 and r.json()["error"]["param"] == f"parameters.{name}", r.text
    with running_server(FakePipeline()) as url:
        refused = httpx.post(f"{url}/invocations", json={"inputs": "x", "parameters": {"return_full_text": True}})
        default = httpx.post(f"{url}/invocations", json={"inputs": "x", "parameters": {"return_full_text": False}})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "parameters.return_full_text"
    assert default.status_code == 200
