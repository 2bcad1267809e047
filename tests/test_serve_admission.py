"""What a server takes at once: its free batch slots plus its queue (serve.max_batch + serve.max_queue), whatever
the worker is doing when the requests arrive; one more is refused with 503 and Retry-After (after waiting
FULL_WAIT_S for places that clients who left still hold).

The first request's prefill is held (the stand-in loop waits for an event) until the whole burst has arrived,
so the burst always meets the worker inside a prefill, the moment no job can move from the queue into a slot.
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from serve_support import FakePipeline, running_server

BODY = {"prompt": "x", "max_tokens": 2}


def waiting_or_answered(url: str, answers: dict[int, httpx.Response], expected: int) -> None:
    """Until each of `expected` requests is queued or answered (a refusal is answered at once)."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if httpx.get(f"{url}/health").json()["queue_depth"] + len(answers) >= expected:
            return
        time.sleep(0.02)
    raise AssertionError(f"after 20 s: {len(answers)} answered, the rest not queued")


@pytest.mark.parametrize("max_batch, max_queue", [(8, 16), (4, 1)])
def test_an_idle_server_takes_a_burst_of_its_slots_plus_its_queue_and_refuses_one_more(max_batch, max_queue):
    pipeline = FakePipeline(reply="ok", max_batch=max_batch)
    pipeline.hold = threading.Event()
    burst = max_batch + max_queue
    answers: dict[int, httpx.Response] = {}
    with running_server(pipeline, max_queue=max_queue) as url:

        def ask(i: int) -> None:
            answers[i] = httpx.post(f"{url}/v1/completions", json=BODY, timeout=30)

        clients = [threading.Thread(target=ask, args=(i,)) for i in range(burst)]
        clients[0].start()
        assert pipeline.prefilling.wait(10)  # the worker is inside the first request's prefill
        for client in clients[1:]:
            client.start()
        waiting_or_answered(url, answers, burst - 1)
        extra = httpx.post(f"{url}/v1/completions", json=BODY, timeout=30)
        pipeline.hold.set()
        for client in clients:
            client.join(30)
    statuses = [answers[i].status_code for i in range(burst)]
    assert statuses == [200] * burst, f"{statuses.count(200)} x 200 of {burst}: {statuses}"
    assert extra.status_code == 503 and extra.headers["retry-after"] == "1", extra.text
    assert "serve.max_queue" in extra.json()["error"]["message"]


def test_a_request_that_fills_the_server_is_not_refused_for_places_its_client_has_just_left():
    """A client whose request held every place leaves and sends the next one at once: the route notices the
    departure within DISCONNECT_POLL_S, so the next request waits for those places instead of a 503 (schemathesis,
    sending one request after another, got one). Before: 503 'the queue is full'."""
    pipeline = FakePipeline(reply="ok", max_batch=2)
    pipeline.hold = threading.Event()
    every_place = {**BODY, "n": 3}  # max_batch 2 + max_queue 1
    with running_server(pipeline, max_queue=1) as url:
        with pytest.raises(httpx.ReadTimeout):  # held in prefill, the client leaves between two of the route's polls
            httpx.post(f"{url}/v1/completions", json=every_place, timeout=0.62)
        answer: list[httpx.Response] = []
        client = threading.Thread(
            target=lambda: answer.append(httpx.post(f"{url}/v1/completions", json=every_place, timeout=30))
        )
        client.start()
        time.sleep(1.5)  # the next request has been queued or refused by now
        pipeline.hold.set()
        client.join(30)
    assert answer[0].status_code == 200, answer[0].text
