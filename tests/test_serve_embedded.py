"""`neuron-ssp serve` on the embedded model, as clients use it: the official openai package, SageMaker
bodies, bad requests, a disconnect, /metrics, and the playground in a real headless Chromium.

One server for the module (one model load), started the way helper i11's endpoint runs it:
`neuron-ssp serve --sagemaker --host 127.0.0.1 --port P` (an explicit host/port beats --sagemaker's).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest
import yaml
from chromium_support import require_chromium
from serve_support import free_port

from neuron_ssp.config import DEFAULT_CONFIG

pytestmark = pytest.mark.slow

openai = pytest.importorskip("openai")

MODEL = "smollm2-135m-instruct"
PROMPT = (
    "Summarize: The Eiffel Tower is a wrought-iron lattice tower in Paris. It is named after the engineer "
    "Gustave Eiffel, whose company designed and built it from 1887 to 1889."
)
TOKENS = 24
CLI = [sys.executable, "-c", "from neuron_ssp.cli import main; main()"]


def cli_env(cache: str) -> dict[str, str]:
    return {**os.environ, "NEURON_SSP_CACHE": cache}


@pytest.fixture(scope="module")
def server(embedded_cache: str):
    port = free_port()
    with tempfile.TemporaryFile(mode="w+") as log:
        proc = subprocess.Popen(
            [
                *CLI,
                "serve",
                "--sagemaker",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--max-queue",
                "4",
                "--request-timeout",
                "900",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            env=cli_env(embedded_cache),
        )
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 600
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                log.seek(0)
                raise AssertionError(f"server did not start:\n{log.read()}")
            try:
                if httpx.get(f"{url}/ping").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.5)
        yield url
        proc.terminate()  # SIGTERM: drains and exits 0
        code = proc.wait(120)
        log.seek(0)
        assert code == 0, log.read()


@pytest.fixture(scope="module")
def client(server: str):
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", timeout=900)


def generate_json(cache: str, prompt: str, tmp_path: Path, chat_template: bool = True) -> dict:
    args = [*CLI, "generate", "--json", "--max-new-tokens", str(TOKENS), prompt]
    if not chat_template:  # the default config, raw prompt (what /v1/completions sends)
        data = yaml.safe_load(DEFAULT_CONFIG.read_text())
        data["generation"]["chat_template"] = False
        config = tmp_path / "raw.yaml"
        config.write_text(yaml.safe_dump(data))
        args[args.index("generate") + 1 : args.index("generate") + 1] = ["--config", str(config)]
    out = subprocess.run(args, capture_output=True, text=True, env=cli_env(cache), timeout=900, check=True)
    return json.loads(out.stdout)


def test_chat_greedy_equals_generate_json_and_stream_equals_non_stream(client, embedded_cache, tmp_path):
    expected = generate_json(embedded_cache, PROMPT, tmp_path)["text"]
    messages = [{"role": "user", "content": PROMPT}]
    reply = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=TOKENS, temperature=0)
    assert reply.choices[0].message.content == expected
    assert reply.usage.completion_tokens == TOKENS and reply.choices[0].finish_reason == "length"
    assert reply.model_extra["speculative"]["target_calls"] >= 1
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=messages,
            max_tokens=TOKENS,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected
    assert chunks[-1].usage.completion_tokens == TOKENS


def test_completions_greedy_equals_generate_json_without_template(client, embedded_cache, tmp_path):
    prompt = "The Eiffel Tower is a wrought-iron lattice tower in Paris. It is named after"
    expected = generate_json(embedded_cache, prompt, tmp_path, chat_template=False)["text"]
    reply = client.completions.create(model=MODEL, prompt=prompt, max_tokens=TOKENS, temperature=0)
    assert reply.choices[0].text == expected
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(model=MODEL, prompt=prompt, max_tokens=TOKENS, temperature=0, stream=True)
    )
    assert streamed == expected


def test_logprobs_come_from_the_target_and_sampled_requests_get_fresh_seeds(client):
    messages = [{"role": "user", "content": PROMPT}]
    greedy = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=8, temperature=0, logprobs=True, top_logprobs=3
    )
    content = greedy.choices[0].logprobs.content
    assert "".join(e.token for e in content) == greedy.choices[0].message.content
    for entry in content:  # greedy: every chosen token is the target's most likely one
        assert entry.top_logprobs[0].token == entry.token and entry.logprob == entry.top_logprobs[0].logprob
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 3
    hot = [
        client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=1.0) for _ in range(2)
    ]
    seeds = [r.model_extra["speculative"]["seed"] for r in hot]
    assert seeds[0] != seeds[1] and hot[0].choices[0].message.content != hot[1].choices[0].message.content
    again = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=16, temperature=1.0, seed=seeds[0]
    )
    assert again.choices[0].message.content == hot[0].choices[0].message.content  # the reported seed reproduces it


PLACE = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "year": {"type": "integer"}},
    "required": ["city", "year"],
    "additionalProperties": False,
}
EIFFEL = "The Eiffel Tower was finished in Paris in 1889. Give the city and the year as JSON."
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


def test_a_json_schema_answer_is_schema_valid_greedy_with_speculation_on(client):
    jsonschema = pytest.importorskip("jsonschema")
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": EIFFEL}],
        max_tokens=64,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "place", "schema": PLACE, "strict": True}},
    )
    answer = json.loads(reply.choices[0].message.content)
    jsonschema.validate(answer, PLACE)
    assert reply.choices[0].finish_reason == "stop" and reply.model_extra["speculative"]["draft_tokens"] > 0
    choice = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Is Paris in France? Answer yes or no."}],
        max_tokens=8,
        temperature=0,
        extra_body={"guided_choice": ["yes", "no"]},
    )
    assert choice.choices[0].message.content in ("yes", "no")


def test_a_required_tool_call_is_a_valid_call_plain_and_streamed(client):
    jsonschema = pytest.importorskip("jsonschema")
    asked = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "max_tokens": 48,
        "temperature": 0,
        "tools": [WEATHER],
        "tool_choice": "required",
    }
    reply = client.chat.completions.create(**asked)
    [call] = reply.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and reply.choices[0].finish_reason == "tool_calls"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
    chunks = list(client.chat.completions.create(**asked, stream=True))
    deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
    assert deltas[0].function.name == "get_weather" and deltas[0].index == 0
    assert "".join(d.function.arguments or "" for d in deltas) == call.function.arguments


def test_each_of_n_sampled_choices_is_the_single_request_with_its_derived_seed(client):
    import hashlib

    asked = {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 16, "temperature": 1.0}
    both = client.chat.completions.create(**asked, n=2, seed=7)
    second_seed = int.from_bytes(hashlib.sha256(b"7:1").digest()[:8], "big") >> 1
    alone = [client.chat.completions.create(**asked, seed=seed) for seed in (7, second_seed)]
    assert [c.message.content for c in both.choices] == [a.choices[0].message.content for a in alone]
    assert both.usage.completion_tokens == sum(a.usage.completion_tokens for a in alone)


def test_models_lists_the_served_name(client):
    assert [m.id for m in client.models.list()] == [MODEL]


def test_sagemaker_ping_and_invocations_with_both_body_styles(server):
    assert httpx.get(f"{server}/ping").status_code == 200
    lmi = httpx.post(f"{server}/invocations", json={"inputs": PROMPT, "parameters": {"max_new_tokens": 8}}, timeout=900)
    chat = httpx.post(
        f"{server}/invocations", json={"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 8}, timeout=900
    )
    assert lmi.status_code == chat.status_code == 200
    assert lmi.json()["generated_text"] and chat.json()["choices"][0]["message"]["content"]
    with httpx.stream(
        "POST",
        f"{server}/invocations",
        json={"inputs": PROMPT, "stream": True, "parameters": {"max_new_tokens": 8}},
        timeout=900,
    ) as r:
        lines = [json.loads(line) for line in r.iter_lines() if line]
    assert r.headers["content-type"].startswith("application/jsonlines")
    assert "".join(line["token"]["text"] for line in lines) == lmi.json()["generated_text"]


@pytest.mark.parametrize(
    "body, status, param",
    [
        ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "temperature": -0.5}, 400, "temperature"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "top_p": 1.5}, 400, "top_p"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "n": 500}, 400, "n"),
        ({"model": MODEL, "messages": "hi"}, 400, "messages"),
        ({"model": "llama-2-70b", "messages": [{"role": "user", "content": "hi"}]}, 404, "model"),
        (
            {"model": MODEL, "messages": [{"role": "user", "content": "word " * 2100}], "max_tokens": 16},
            400,
            "messages",
        ),  # the prompt alone is over the context: no max_tokens fits it
    ],
)
def test_bad_requests_on_the_real_model(server, body, status, param):
    r = httpx.post(f"{server}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == status and r.json()["error"]["param"] == param, r.text
    assert "Fix:" in r.json()["error"]["message"]


def test_invalid_json_and_oversized_bodies(server):
    bad = httpx.post(
        f"{server}/v1/completions", content=b'{"prompt": ', timeout=60, headers={"content-type": "application/json"}
    )
    huge = httpx.post(f"{server}/v1/completions", content=b"x" * (1 << 20 + 1), timeout=60)
    assert bad.status_code == 400 and "not valid JSON" in bad.json()["error"]["message"]
    assert huge.status_code == 413


def test_openai_client_raises_its_own_errors(client):
    with pytest.raises(openai.BadRequestError, match="top_p"):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], top_p=0)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])


def metric_values(server: str) -> dict[str, float]:
    values = {}
    for line in httpx.get(f"{server}/metrics").text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


def test_disconnect_mid_stream_frees_the_worker(server):
    before = metric_values(server)
    with httpx.stream(
        "POST", f"{server}/v1/completions", timeout=900, json={"prompt": PROMPT, "max_tokens": 1000, "stream": True}
    ) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                break  # one token arrived: the generation is running; now hang up
    start = time.monotonic()
    short = httpx.post(f"{server}/v1/completions", json={"prompt": "Paris is", "max_tokens": 2}, timeout=900)
    waited = time.monotonic() - start
    after = metric_values(server)
    assert short.status_code == 200
    # the abandoned request was cut: far fewer than its 1000 tokens were generated, and it was never counted done
    generated = after["neuron_ssp_generation_tokens_total"] - before["neuron_ssp_generation_tokens_total"]
    assert generated == 2, generated
    assert waited < 120 and after["neuron_ssp_running_requests"] == 0


def test_metrics_counters_match_the_requests_sent(server):
    before = metric_values(server)
    ok = '{endpoint="/v1/completions",status="200"}'
    bad = '{endpoint="/v1/completions",status="400"}'
    for _ in range(2):
        assert (
            httpx.post(
                f"{server}/v1/completions", json={"prompt": "Paris is", "max_tokens": 3}, timeout=900
            ).status_code
            == 200
        )
    httpx.post(f"{server}/v1/completions", json={"prompt": "Paris is", "n": 500})
    after = metric_values(server)
    delta = {name: after.get(name, 0) - before.get(name, 0) for name in after}
    assert delta[f"neuron_ssp_requests_total{ok}"] == 2 and delta[f"neuron_ssp_requests_total{bad}"] == 1
    assert delta["neuron_ssp_generation_tokens_total"] == 6
    assert delta["neuron_ssp_e2e_request_latency_seconds_count"] == 2
    assert delta["neuron_ssp_time_to_first_token_seconds_count"] == 2
    assert after["neuron_ssp_queue_depth"] == 0


def chromium_driver(tmp_path: Path):
    browser, driver = require_chromium()  # or skips/fails, saying why (tests/chromium_support.py)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--window-size=1200,900",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
    ):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(executable_path=driver), options=options)


def test_playground_in_headless_chromium_matches_the_api(server, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    tokens = 40
    api = httpx.post(
        f"{server}/v1/chat/completions",
        timeout=900,
        json={
            "model": MODEL,
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": tokens,
            "temperature": 0,
        },
    )
    expected = api.json()["choices"][0]["message"]["content"]
    driver = chromium_driver(tmp_path)
    try:
        driver.get(f"{server}/")
        prompt = driver.find_element(By.ID, "prompt")
        prompt.clear()
        prompt.send_keys(PROMPT)
        for field, value in (("max_tokens", tokens), ("temperature", 0)):
            box = driver.find_element(By.ID, field)
            box.clear()
            box.send_keys(str(value))
        driver.find_element(By.ID, "run").click()
        WebDriverWait(driver, 900, poll_frequency=0.5).until(
            lambda d: d.find_element(By.ID, "status").text in ("done", "error")
        )
        assert driver.find_element(By.ID, "error").text == ""
        page_text = driver.execute_script("return document.getElementById('output').textContent")
        drafted = driver.find_elements(By.CSS_SELECTOR, "#output span.tok-draft")
        chosen = driver.find_elements(By.CSS_SELECTOR, "#output span.tok-target")
        screenshot = tmp_path / "playground.png"
        driver.save_screenshot(str(screenshot))
        if os.environ.get("NEURON_SSP_KEEP_SCREENSHOT"):
            shutil.copy(screenshot, os.environ["NEURON_SSP_KEEP_SCREENSHOT"])
        acceptance = driver.find_element(By.ID, "acceptance").text
        tokens_per_s = driver.find_element(By.ID, "tps").text
        counted = driver.find_element(By.ID, "tokens").text
        top_p = driver.find_element(By.ID, "top_p")
        top_p.clear()
        top_p.send_keys("0")  # refused with a 400
        driver.find_element(By.ID, "run").click()
        WebDriverWait(driver, 120, poll_frequency=0.5).until(lambda d: d.find_element(By.ID, "status").text == "error")
        after_error = tuple(driver.find_element(By.ID, name).text for name in ("status", "tokens", "acceptance", "tps"))
    finally:
        driver.quit()
    assert page_text == expected
    assert chosen and drafted, "the page shades target-chosen and accepted-draft tokens"
    assert float(acceptance) > 0 and float(tokens_per_s) > 0
    assert screenshot.stat().st_size > 0
    assert counted == str(api.json()["usage"]["completion_tokens"])  # the page counts what usage counts
    assert after_error == ("error", "0", "-", "-")  # a failed run leaves no stale statistics behind


def test_playground_sends_and_shows_64_bit_seeds_exactly(server, tmp_path):
    """A JavaScript number holds 53 bits: the page sent 9223372036854775807 as ...808 (over the limit, a 400),
    showed no seed, and its seed box cut its placeholder off. The seed it shows must reproduce its text."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    def run(seed: str) -> tuple[str, str]:
        box = driver.find_element(By.ID, "seed")
        box.clear()
        box.send_keys(seed)
        driver.find_element(By.ID, "run").click()
        WebDriverWait(driver, 900, poll_frequency=0.5).until(
            lambda d: d.find_element(By.ID, "status").text in ("done", "error")
        )
        assert driver.find_element(By.ID, "error").text == ""
        return (
            driver.execute_script("return document.getElementById('output').textContent"),
            driver.find_element(By.ID, "seed_used").text,
        )

    def api(seed: int) -> str:
        return httpx.post(
            f"{server}/v1/chat/completions",
            timeout=900,
            json={
                "model": MODEL,
                "messages": [{"role": "user", "content": PROMPT}],
                "max_tokens": 8,
                "temperature": 0.8,
                "seed": seed,
            },
        ).json()["choices"][0]["message"]["content"]

    driver = chromium_driver(tmp_path)
    try:
        driver.get(f"{server}/")
        fits = driver.execute_script("""const box = document.getElementById("seed"), style = getComputedStyle(box);
            const ctx = document.createElement("canvas").getContext("2d"); ctx.font = style.font;
            return ctx.measureText(box.placeholder).width <= box.clientWidth - parseFloat(style.paddingLeft)
                - parseFloat(style.paddingRight);""")
        prompt = driver.find_element(By.ID, "prompt")
        prompt.clear()
        prompt.send_keys(PROMPT)
        for field, value in (("max_tokens", 8), ("temperature", 0.8)):
            box = driver.find_element(By.ID, field)
            box.clear()
            box.send_keys(str(value))
        typed, typed_seed = run("9223372036854775807")
        fresh, fresh_seed = run("")
    finally:
        driver.quit()
    assert fits, "the seed box cuts its placeholder off"
    assert typed_seed == "9223372036854775807" and typed == api(2**63 - 1)
    assert fresh_seed.lstrip("-").isdigit() and fresh == api(int(fresh_seed))  # the shown seed reproduces it


def test_playground_sends_a_json_schema_and_shows_the_answer_follows_it(server, tmp_path):
    jsonschema = pytest.importorskip("jsonschema")
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver = chromium_driver(tmp_path)
    try:
        driver.get(f"{server}/")
        prompt = driver.find_element(By.ID, "prompt")
        prompt.clear()
        prompt.send_keys(EIFFEL)
        driver.find_element(By.CSS_SELECTOR, "#structured summary").click()  # open the schema box
        driver.find_element(By.ID, "schema").send_keys(json.dumps(PLACE))
        driver.find_element(By.ID, "run").click()
        WebDriverWait(driver, 900, poll_frequency=0.5).until(
            lambda d: d.find_element(By.ID, "status").text in ("done", "error")
        )
        error = driver.find_element(By.ID, "error").text
        answer = driver.execute_script("return document.getElementById('output').textContent")
        check = driver.find_element(By.ID, "json_check").text
        driver.find_element(By.ID, "schema").send_keys("}")  # no longer JSON: refused before anything is sent
        driver.find_element(By.ID, "run").click()
        WebDriverWait(driver, 60, poll_frequency=0.2).until(lambda d: d.find_element(By.ID, "status").text == "error")
        refused = driver.find_element(By.ID, "error").text
    finally:
        driver.quit()
    assert error == "" and check == "parses"
    jsonschema.validate(json.loads(answer), PLACE)
    assert "not JSON" in refused
