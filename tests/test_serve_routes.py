"""/tokenize and /detokenize (vLLM's shapes), GET /v1/models/{id}, and CORS (vLLM's defaults, --allowed-origins)."""

from __future__ import annotations

import httpx
import pytest
from serve_support import FakePipeline, running_server
from tokenizer_support import byte_level_tokenizer

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_tokenize_gives_the_ids_a_generation_route_sees_and_detokenize_inverts_it():
    tokenizer = byte_level_tokenizer()
    tokenizer.chat_template = CHATML
    pipeline = FakePipeline(reply="ok", tokenizer=tokenizer)
    messages = [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "The quick brown fox"}]
    with running_server(pipeline) as url:
        text = httpx.post(f"{url}/tokenize", json={"model": "fake-model", "prompt": "The quick brown fox"}).json()
        httpx.post(f"{url}/v1/completions", json={"prompt": "The quick brown fox", "max_tokens": 2})
        completion_ids = pipeline.calls[-1]["prompt_ids"].tolist()
        chat = httpx.post(f"{url}/tokenize", json={"messages": messages, "return_token_strs": True}).json()
        httpx.post(f"{url}/v1/chat/completions", json={"messages": messages, "max_tokens": 2})
        chat_ids = pipeline.calls[-1]["prompt_ids"].tolist()
        back = httpx.post(f"{url}/detokenize", json={"tokens": chat["tokens"]}).json()
        closed = httpx.post(f"{url}/tokenize", json={"messages": messages, "add_generation_prompt": False}).json()
    assert text == {"count": len(completion_ids), "max_model_len": 256, "tokens": completion_ids, "token_strs": None}
    assert chat["tokens"] == chat_ids and chat["count"] == len(chat_ids)
    assert chat["token_strs"] == tokenizer.convert_ids_to_tokens(chat_ids)
    rendered = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nThe quick brown fox<|im_end|>\n"
    assert back == {"prompt": rendered + "<|im_start|>assistant\n"}
    assert closed["count"] < chat["count"]


@pytest.mark.parametrize(
    "path, body, status, param, words",
    [
        ("/detokenize", {"tokens": [1, 0x110000]}, 400, "tokens.1", ["0..1114111"]),
        ("/detokenize", {"tokens": [-1]}, 400, "tokens.0", [">= 0"]),
        ("/detokenize", {"tokens": [1], "model": "gpt-4"}, 404, "model", ["no such model"]),
        ("/tokenize", {"prompt": " "}, 400, "prompt", ["not white space"]),
        ("/tokenize", {"prompt": "x", "add_special_tokens": False}, 400, "add_special_tokens", ["not supported"]),
        (
            "/tokenize",
            {"messages": [{"role": "user", "content": "x"}], "chat_template": "{{ 1 }}"},
            400,
            "chat_template",
            [],
        ),
        ("/tokenize", {}, 400, "prompt", ["required"]),
    ],
)
def test_token_routes_refuse_what_they_cannot_do_naming_the_field(path, body, status, param, words):
    with running_server(FakePipeline()) as url:
        r = httpx.post(f"{url}{path}", json=body)
    assert r.status_code == status and r.json()["error"]["param"] == param, r.text
    assert all(word in r.json()["error"]["message"] for word in words), r.text


def test_a_model_card_by_id_and_a_404_for_another_id():
    with running_server(FakePipeline()) as url:
        card = httpx.get(f"{url}/v1/models/fake-model")
        other = httpx.get(f"{url}/v1/models/meta-llama/Llama-3.1-8B")
        listed = httpx.get(f"{url}/v1/models").json()["data"][0]
    assert card.status_code == 200 and card.json()["id"] == "fake-model"
    assert {k: v for k, v in card.json().items() if k != "created"} == {
        k: v for k, v in listed.items() if k != "created"
    }
    assert other.status_code == 404 and other.json()["error"]["param"] == "model_id"
    assert "meta-llama/Llama-3.1-8B" in other.json()["error"]["message"]


def test_cors_allows_any_origin_by_default_and_only_the_listed_ones_when_set():
    preflight = {"Origin": "https://app.example.com", "Access-Control-Request-Method": "POST"}
    with running_server(FakePipeline(), api_key="secret") as url:
        opened = httpx.options(
            f"{url}/v1/chat/completions", headers={**preflight, "Access-Control-Request-Headers": "authorization"}
        )
        refused = httpx.post(f"{url}/v1/models", headers={"Origin": "https://app.example.com"})
    assert opened.status_code == 200 and opened.headers["access-control-allow-origin"] == "*"
    assert refused.status_code in (401, 405) and refused.headers["access-control-allow-origin"] == "*"
    with running_server(FakePipeline(), allowed_origins=["https://app.example.com"]) as url:
        listed = httpx.options(f"{url}/v1/completions", headers=preflight)
        other = httpx.options(f"{url}/v1/completions", headers={**preflight, "Origin": "https://evil.example"})
        answer = httpx.get(f"{url}/v1/models", headers={"Origin": "https://app.example.com"})
    assert listed.status_code == 200 and listed.headers["access-control-allow-origin"] == "https://app.example.com"
    assert other.status_code == 400 and "access-control-allow-origin" not in other.headers
    assert answer.headers["access-control-allow-origin"] == "https://app.example.com"
