"""The playground's seed and JSON schema handling, run in Node.js on the page's own script (a stubbed DOM).

Seeds are 64-bit integers and a JavaScript number holds 53 bits: the page must send the typed digits as
they are and read the seed the server used from the chunk's text, not through a number, or a seed shown
by the page would not reproduce its sample. tests/test_serve_embedded.py runs the whole page in Chromium.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from importlib import resources

import pytest

NODE = shutil.which("node")
pytestmark = pytest.mark.skipif(NODE is None, reason="needs Node.js to run the page's script")

STUB = """
const values = {prompt: "Hi", max_tokens: "8", temperature: "0.7", top_p: "1", top_k: "0", seed: %s, api_key: "",
                schema: %s};
const elements = {};
globalThis.document = {getElementById: (id) => elements[id] ??= {
  value: values[id] ?? "", textContent: "", addEventListener() {}, appendChild() {}}};
"""


def run_page(seed: str, then: str, schema: str = "") -> str:
    page = resources.files("neuron_ssp.serve").joinpath("static/playground.html").read_text()
    script = re.search(r"<script>(.*)</script>", page, re.S).group(1)
    out = subprocess.run(
        [NODE, "-e", STUB % (json.dumps(seed), json.dumps(schema)) + script + then],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.parametrize("seed", ["9223372036854775807", "-9223372036854775808", "9007199254740993", "42", "007"])
def test_the_typed_seed_is_sent_digit_for_digit(seed):
    body = run_page(seed, "console.log(requestBody());")
    assert re.search(r'"seed":\s*(-?\d+)', body).group(1) == str(int(seed))
    assert json.loads(body)["seed"] == int(seed)


def test_no_seed_typed_sends_none_and_a_malformed_one_is_refused_before_sending():
    assert "seed" not in json.loads(run_page("", "console.log(requestBody());"))
    said = run_page("12e3", "try { requestBody(); console.log('sent'); } catch (e) { console.log(e.message); }")
    assert said != "sent" and "seed" in said


def test_the_seed_the_server_used_is_read_exactly_from_the_chunk():
    chunk = json.dumps(
        {"choices": [{"delta": {"content": '"seed": 1'}}], "speculative": {"tokens": [], "seed": 9223372036854775807}}
    )
    assert run_page("", f"console.log(seedUsed({json.dumps(chunk)}));") == "9223372036854775807"
    greedy = json.dumps({"speculative": {"tokens": [], "seed": None}})
    assert run_page("", f"console.log(seedUsed({json.dumps(greedy)}));") == "null"


def test_a_json_schema_is_sent_as_a_strict_response_format_and_a_bad_one_is_refused_before_sending():
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    body = json.loads(run_page("42", "console.log(requestBody());", json.dumps(schema)))
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "playground", "schema": schema, "strict": True},
    }
    assert body["seed"] == 42 and "response_format" not in json.loads(run_page("", "console.log(requestBody());"))
    for bad, words in (("{not json", "not JSON"), ("[1, 2]", "must be an object")):
        said = run_page("", "try { requestBody(); console.log('sent'); } catch (e) { console.log(e.message); }", bad)
        assert said != "sent" and words in said, said
