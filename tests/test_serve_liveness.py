"""The event loop stays free while huge prompts arrive: /health answers within a liveness probe's margin.

Three ~1 MB prompts during a stream, on a real byte-level BPE tokenizer (about 0.7 s of tokenization per MB here):
with a tokenizer whose bound is known they are refused before they are tokenized; with one that may shorten a text
(an NFC normalizer) they are tokenized, off the loop, and then refused by the context rule.
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from serve_support import FakePipeline, running_server
from tokenizer_support import byte_level_tokenizer
from tokenizers import normalizers

HEALTH_LIMIT_S = 0.25  # the figure: a 1 s liveness probe with room to spare
HUGE = "The quick brown fox jumps over the lazy dog. " * 22_000  # 990,000 characters: under the 1 MiB body cap


@pytest.mark.parametrize("bounded", [True, False], ids=["refused-before-tokenizing", "tokenized-off-the-loop"])
def test_health_answers_within_250_ms_while_three_1_mb_prompts_arrive(bounded):
    tokenizer = byte_level_tokenizer() if bounded else byte_level_tokenizer(normalizer=normalizers.NFC())
    pipeline = FakePipeline(reply="abc" * 40, step_s=0.02, tokenizer=tokenizer)
    assert (pipeline.prompt_limit.reach is not None) == bounded
    answers: list[httpx.Response] = []
    with running_server(pipeline, request_timeout=60) as url:
        stream = threading.Thread(
            target=lambda: httpx.post(f"{url}/v1/completions", json={"prompt": "hi", "stream": True}, timeout=60)
        )
        stream.start()
        huge = [
            threading.Thread(
                target=lambda: answers.append(
                    httpx.post(f"{url}/v1/completions", json={"prompt": HUGE, "max_tokens": 4}, timeout=60)
                )
            )
            for _ in range(3)
        ]
        for thread in huge:
            thread.start()
        waits = []
        with httpx.Client() as client:
            while len(answers) < 3 or len(waits) < 5:
                begin = time.perf_counter()
                assert client.get(f"{url}/health").status_code == 200
                waits.append(time.perf_counter() - begin)
                time.sleep(0.01)
        for thread in [*huge, stream]:
            thread.join(60)
    print(f"/health: {len(waits)} probes, slowest {max(waits) * 1000:.1f} ms")
    assert max(waits) < HEALTH_LIMIT_S
    assert [a.status_code for a in answers] == [400] * 3
    assert {a.json()["error"]["param"] for a in answers} == {"prompt"}
    rule = "no token of this tokenizer stands for more than" if bounded else "cache positions, more than the"
    assert all(rule in a.json()["error"]["message"] for a in answers)
