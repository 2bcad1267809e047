"""NxD Inference's fused speculation with continuous batching, on the real NxDI code (CPU mode): rows join and leave
a batch of 2 and of 4 (different prompt lengths, budgets, an EOS), each row's greedy output equal to its output at
batch 1; a failing or cancelled row leaves and the others go on; a sampled request is refused.

Runs in .venv-nxdi (`bash .ci/nxdi.sh`); skips elsewhere with the reason (tests/nxdi_fixtures.py).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from neuron_support import prompt
from nxdi_support.configs import nxdi_config
from nxdi_support.recording import recorded_forward

from neuron_ssp.engines.nxdi_fused import GREEDY, NxdiFusedEngine, NxdiFusedLoop, compiled_batch
from neuron_ssp.engines.rows import Row, RowCallbacks, RowRequest, RowSettings
from neuron_ssp.errors import RuntimeProblem, UsageError
from neuron_ssp.speculation.sampling import SamplingParams
from neuron_ssp.topology import plan_deployment

pytest_plugins = ["neuron_fixtures", "nxdi_fixtures"]  # tiny_model_dirs; nxdi

K = 4
# (prompt length, prompt seed, budget): lengths and budgets differ so rows leave at different steps
REQUESTS = [(5, 1, 20), (9, 2, 6), (13, 3, 14), (7, 4, 1), (11, 5, 17), (6, 6, 10)]
EOS_REQUEST = 2  # ends at an EOS: its batch-1 output's fifth token


def fused_config(tiny_model_dirs: dict[str, Path], batch: int) -> Any:
    batches = {"batch_size": batch}
    return nxdi_config(
        tiny_model_dirs["target"],
        tiny_model_dirs["draft"],
        target=batches,
        draft=batches,
        speculation={"engine": "fused", "acceptor": "greedy", "k": K},
        neuron={"self_test": False},
    )


def fused_target(tiny_model_dirs: dict[str, Path], batch: int) -> Any:
    from neuron_ssp.backends.nxdi.load import load_nxdi_fused

    config = fused_config(tiny_model_dirs, batch)
    return load_nxdi_fused(config, plan_deployment(config))[0]


def cut(tokens: list[int], budget: int, eos: set[int]) -> list[int]:
    kept = tokens[:budget]
    ends = [i for i, token in enumerate(kept) if token in eos]
    return kept[: ends[0] + 1] if ends else kept


def serve(loop: NxdiFusedLoop, requests: list[RowRequest]) -> tuple[list[Row], list[int], list[int]]:
    """What a server's scheduler does: fill free slots from the queue between steps. Returns the rows in request
    order, the step at which each joined and the running rows of each step."""
    queue, rows, joined_at, running = list(requests), [], [], []
    while queue or loop.rows:
        while queue and loop.free_slots:
            joined_at.append(len(running))
            rows.append(loop.join(queue.pop(0)))
        running.append(len(loop.rows))
        loop.step()
    return rows, joined_at, running


@pytest.mark.parametrize("batch", [2, 4])
def test_rows_joining_and_leaving_decode_as_each_would_alone(
    nxdi: Any, tiny_model_dirs: dict[str, Path], batch: int
) -> None:
    alone = NxdiFusedEngine(fused_target(tiny_model_dirs, 1), K)
    prompts = [prompt(length, seed) for length, seed, _ in REQUESTS]
    full = [alone.generate(ids, 20).tokens for ids in prompts]  # batch 1; each budget's output is a prefix
    eos = [{full[i][4]} if i == EOS_REQUEST else set() for i in range(len(REQUESTS))]
    expected = [cut(full[i], budget, eos[i]) for i, (_, _, budget) in enumerate(REQUESTS)]
    assert len(expected[EOS_REQUEST]) <= 5 < REQUESTS[EOS_REQUEST][2]  # the EOS ends it before its budget

    target = fused_target(tiny_model_dirs, batch)
    calls = recorded_forward(target.model)
    loop = NxdiFusedLoop(target, K)
    assert (loop.slots, loop.free_slots) == (batch, batch)
    streamed: list[list[int]] = [[] for _ in REQUESTS]
    requests = [
        RowRequest(ids, budget, eos[i], RowSettings(GREEDY), RowCallbacks(on_tokens=streamed[i].extend))
        for i, (ids, (_, _, budget)) in enumerate(zip(prompts, REQUESTS, strict=True))
    ]
    rows, joined_at, running = serve(loop, requests)

    assert [row.result().tokens for row in rows] == expected
    assert streamed == expected
    assert max(running) == batch and min(running) < batch  # full steps and steps with free lines
    assert any(step > 0 for step in joined_at)  # requests joined a running batch
    assert loop.free_slots == batch and loop.rows == [] and not any(row.prefilling for row in rows)
    assert all(row.stats.new_tokens == len(row.result().tokens) for row in rows)
    assert all(row.stats.draft_tokens == (K - 1) * row.stats.target_calls for row in rows if row.stats.target_calls)
    prefills = [c for c in calls if c["position_ids"][0][0] == 0]
    assert [len(c["seq_ids"]) for c in prefills] == [1] * len(REQUESTS)  # each prompt its own call, batch 1
    steps = [c for c in calls if c not in prefills]
    for call in steps:  # rows sorted by cache line, one token each at its own position, its own mask
        assert call["seq_ids"] == sorted(set(call["seq_ids"])) and all(0 <= s < batch for s in call["seq_ids"])
        assert [len(ids) for ids in call["input_ids"]] == [1] * len(call["seq_ids"])
        assert [sum(mask) for mask in call["attention_mask"]] == [p[0] for p in call["position_ids"]]
    assert {len(c["seq_ids"]) for c in steps} >= {1, batch}  # NxDI padded the calls with fewer rows


def test_a_failing_row_and_a_cancelled_row_leave_and_the_others_go_on(
    nxdi: Any, tiny_model_dirs: dict[str, Path]
) -> None:
    loop = NxdiFusedLoop(fused_target(tiny_model_dirs, 4), K)
    ids = [prompt(8, 11), prompt(6, 12), prompt(10, 13)]
    steps = 0
    failing = loop.join(
        RowRequest(ids[0], 20, settings=RowSettings(GREEDY), callbacks=RowCallbacks(on_tokens=fails_on_call(2)))
    )
    cancelled = loop.join(
        RowRequest(ids[1], 20, settings=RowSettings(GREEDY), callbacks=RowCallbacks(should_stop=lambda: steps >= 3))
    )
    survivor = loop.join(RowRequest(ids[2], 20, settings=RowSettings(GREEDY)))
    while loop.rows:
        loop.step()
        steps += 1
    assert isinstance(failing.error, ValueError) and failing.finished and not failing.cancelled
    assert cancelled.cancelled and cancelled.error is None and cancelled.seq.generated_count < 20
    assert survivor.error is None and not survivor.cancelled and len(survivor.result().tokens) == 20
    assert loop.free_slots == 4
    for row, request_ids in zip((failing, cancelled, survivor), ids, strict=True):  # alone, in a reused line
        assert (
            row.seq.generated()
            == loop.run(RowRequest(request_ids, 20, settings=RowSettings(GREEDY))).tokens[: row.seq.generated_count]
        )
    with pytest.raises(ValueError, match="client went away"):  # run raises the row's own error
        loop.run(
            RowRequest(ids[0], 20, settings=RowSettings(GREEDY), callbacks=RowCallbacks(on_tokens=fails_on_call(2)))
        )
    assert loop.free_slots == 4


def fails_on_call(n: int) -> Any:
    """A streaming callback whose client goes away on its n-th call."""
    calls = 0

    def on_tokens(tokens: list[int]) -> None:
        nonlocal calls
        calls += 1
        if calls == n:
            raise ValueError("client went away")

    return on_tokens


def test_a_full_batch_refuses_another_row_and_a_sampled_request_is_refused(
    nxdi: Any, tiny_model_dirs: dict[str, Path]
) -> None:
    target = fused_target(tiny_model_dirs, 2)
    calls = recorded_forward(target.model)
    loop = NxdiFusedLoop(target, K)
    with pytest.raises(UsageError) as refused:
        loop.join(RowRequest(prompt(6), 8, settings=RowSettings(SamplingParams(temperature=0.7, top_k=5))))
    (problem,) = refused.value.problems
    assert (problem.field, problem.value) == ("temperature", 0.7)
    assert "model_base.py:1162" in problem.rule and "speculation.engine: native" in problem.fix
    assert calls == [] and loop.free_slots == 2
    for seed in (1, 2):
        loop.join(RowRequest(prompt(6, seed), 8, settings=RowSettings(GREEDY)))
    with pytest.raises(RuntimeError, match="no free slot: 2 requests are running"):
        loop.join(RowRequest(prompt(6, 3), 8, settings=RowSettings(GREEDY)))


def test_a_fused_target_over_several_rows_is_built_for_continuous_batching(
    nxdi: Any, tiny_model_dirs: dict[str, Path]
) -> None:
    """Prompts one at a time into their own cache line, decoding at the batch, for draft and target alike; batch 1
    builds what it built before (no continuous batching, so the compiled artifacts stay valid)."""
    from neuron_ssp.backends.nxdi.load import NxdiModels, fused_application, prepare_nxdi

    for batch in (1, 4):
        config = fused_config(tiny_model_dirs, batch)
        plan = plan_deployment(config)
        app, spec = fused_application(NxdiModels(config, plan, prepare_nxdi(config, plan)))
        draft = app.config.fused_spec_config.draft_config.neuron_config
        for built in (app.neuron_config, draft):
            assert (
                built.is_continuous_batching,
                built.ctx_batch_size,
                built.tkg_batch_size,
                built.kv_cache_batch_size,
            ) == (batch > 1, 1, batch, batch)
        assert app.context_encoding_model.neuron_config.batch_size == 1
        assert app.fused_spec_model.neuron_config.batch_size == batch
        assert ("is_continuous_batching" in spec.constructor) == (batch > 1)


def test_a_batch_compiled_without_continuous_batching_is_refused() -> None:
    """Rows join one at a time only where NxDI encodes a prompt into the line its seq_id names."""
    settings = {"tkg_batch_size": 4, "is_continuous_batching": False, "ctx_batch_size": 4}
    with pytest.raises(RuntimeProblem) as refused:
        compiled_batch(SimpleNamespace(neuron_config=SimpleNamespace(**settings)))
    assert refused.value.problems[0].field == "target.batch_size"
    one = SimpleNamespace(neuron_config=SimpleNamespace(**{**settings, "tkg_batch_size": 1}))
    assert compiled_batch(one) == 1
