"""One way to run a request: the CLI's generation and a server request go through the engine's row loop alike."""

from __future__ import annotations

import httpx
from conftest import TableBackend
from serve_support import running_server
from test_batching import VOCAB, CompiledTables
from tools_support import CharTokenizer, tiny_config

from neuron_ssp.drafters import NgramDrafter
from neuron_ssp.pipeline.build import Shared, build_generator
from neuron_ssp.pipeline.pipeline import Pipeline
from neuron_ssp.speculation.call_cost import WidthCost

PROMPT = "abcabcabcabcabcabc"
# a target compiled for width 4 (Neuron's shapes): a call of 2 rows' worth is cheap, the padded k-wide call dear.
# Alone, the cost policy's own choice keeps a drafted token (a 2-wide call pays); the loop's choice on compiled
# shapes pads to k or drafts nothing, and at this cost nothing
COST = WidthCost({1: 10.0, 2: 10.5, 4: 60.0})


def compiled_pipeline() -> tuple[Pipeline, CompiledTables]:
    config = tiny_config(speculation={"k": 4, "policy": "cost", "drafter": "ngram"}, serve={"max_batch": 2})
    target = CompiledTables(lambda: TableBackend(VOCAB, 0), 2)
    shared = Shared(COST, NgramDrafter(VOCAB, 3, 1))
    generator = build_generator(config, target, None, shared)
    return Pipeline(config, CharTokenizer(VOCAB), target, None, generator, set(), shared, 2), target


def widths(target: CompiledTables) -> list[int]:
    """The width of every decoding call the target took (prefills are calls of the whole prompt)."""
    return [n for call in target.calls for _, _, n in call]


def test_a_cli_generation_and_a_server_request_take_the_same_windows():
    cli, cli_target = compiled_pipeline()
    text = cli.speculative(PROMPT, max_new_tokens=16).text
    served, server_target = compiled_pipeline()
    with running_server(served) as url:
        answer = httpx.post(f"{url}/v1/completions", json={"prompt": PROMPT, "max_tokens": 16}, timeout=60)
    assert answer.json()["choices"][0]["text"] == text
    assert widths(cli_target) == widths(server_target)
    assert len(widths(cli_target)) == 15  # one token a call: no k-wide call paid
