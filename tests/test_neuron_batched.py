"""The transformers-neuronx backend at batch > 1 through the stand-in: continuous batching, every row in one call.

The stand-in ports the library's batching preprocessing (1ade6d7 base.py `_prepare_for_continuous_batching`,
padding rows and all) and attends per row as its masks do, so what each row gets back here is what it would
get on a device, up to the device's arithmetic. The batch rules (topology/batch_rules.py) allow these configs on
0.13; test_neuron_batch_rules.py holds them against every imitated commit.
"""

from __future__ import annotations

import functools
import inspect
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from neuron_support import STANDIN, VOCAB, neuron_config, prompt
from transformers import LlamaForCausalLM

from neuron_ssp.backends.base import Segment, SlotView
from neuron_ssp.backends.neuron.artifacts import MANIFEST
from neuron_ssp.backends.neuron.batched import BatchedNeuronBackend
from neuron_ssp.backends.neuron.compile import compile_models
from neuron_ssp.backends.neuron.load import load_neuron_backends
from neuron_ssp.backends.torch.load import dtype_kwarg
from neuron_ssp.config import Config, SamplingConfig
from neuron_ssp.drafters import ModelDrafter, NgramDrafter
from neuron_ssp.engines.base import sampling_params
from neuron_ssp.engines.continuous_batch import ContinuousBatchLoop
from neuron_ssp.engines.native import plain_generate
from neuron_ssp.engines.rows import RowRequest, RowSettings
from neuron_ssp.errors import UsageError
from neuron_ssp.speculation.acceptors import GreedyAcceptor
from neuron_ssp.speculation.call_cost import WidthCost
from neuron_ssp.speculation.cost_policy import AcceptanceModel
from neuron_ssp.speculation.policies import CostPolicy, FixedPolicy
from neuron_ssp.topology import plan_deployment

pytest_plugins = ["neuron_fixtures"]  # fixtures: neuronx, neuronx_sdk_2_18, tiny_model_dirs

SLOTS, K = 4, 4
SIGNATURES = json.loads((STANDIN / "neuronx_signatures.json").read_text())


def batched_config(dirs: dict[str, Path], draft: bool = False, slots: int = SLOTS, **sections: Any) -> Config:
    batch = {"batch_size": slots}
    return neuron_config(
        dirs["target"],
        dirs["draft"] if draft else None,
        target=batch,
        **({"draft": batch} if draft else {}),
        **sections,
    )


def load(config: Config) -> tuple[Any, Any]:
    return load_neuron_backends(config, plan_deployment(config))


def sent(standin: ModuleType, model: str = "tiny-target") -> list[tuple[str, list, list | None, list, list]]:
    """(call, cache_ids, start_ids, input_ids, prior positions each executed row reads) of every 2-D model call."""
    return [
        (call, d["cache_ids"], d["start_ids"], d["input_ids"], [row["prior"] for row in d["executed"]])
        for who, call, d in standin.RUNTIME.events
        if who == model and "executed" in d
    ]


@functools.cache
def _reference_model(model_dir: Path) -> LlamaForCausalLM:
    return LlamaForCausalLM.from_pretrained(str(model_dir), **{dtype_kwarg(): torch.float32}).eval()


def reference(model_dir: Path, tokens: list[int], positions: range) -> torch.Tensor:
    """The checkpoint's own next-token logits after tokens[:p + 1], for each p in `positions`."""
    with torch.inference_mode():
        logits = _reference_model(model_dir)(input_ids=torch.tensor([tokens])).logits[0]
    return logits[positions.start : positions.stop]


# ---------------------------------------------------------------- the stand-in against the real library


def test_continuous_batching_config_keeps_the_real_signatures(neuronx_any: ModuleType) -> None:
    import transformers_neuronx.config as config

    for qualified, params in SIGNATURES["continuous_batching"][neuronx_any.API].items():
        class_name, method = qualified.split(".")
        found = [
            {"name": p.name, "kind": p.kind.name.lower()}
            | (
                {}
                if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
                else {"default": None if p.default is p.empty else repr(p.default)}
            )
            for p in inspect.signature(getattr(getattr(config, class_name), method)).parameters.values()
        ]
        assert found == [dict(p) for p in params], qualified


def test_the_standin_pads_a_lone_one_token_call_onto_every_other_sequence(
    neuronx: ModuleType, tiny_model_dirs: dict[str, Path]
) -> None:
    """What the backend avoids, as the library does it (base.py lines 575-587): a one-token call for one
    sequence writes token 0 at cache id 0 of all the others, and cache_ids in another dtype than the inputs
    fail its scatter_."""
    target, _ = load(batched_config(tiny_model_dirs))
    target.prefill_slot(0, prompt(6))
    model = target.model
    with pytest.raises(RuntimeError, match="dtype"):
        model.forward(
            torch.tensor([[7]]),
            cache_ids=torch.tensor([[0]], dtype=torch.int32),
            start_ids=torch.tensor([2], dtype=torch.int32),
        )
    assert model.caches[0][0] == prompt(6)[0]
    model.forward(torch.tensor([[7]]), cache_ids=torch.tensor([[0]]), start_ids=torch.tensor([2], dtype=torch.int32))
    assert model.caches[0][0] == 0 and model.caches[2][0] == 7  # slot 0's first position overwritten


def test_the_standin_refuses_a_prompt_past_the_largest_context_bucket_as_the_library_does(
    neuronx: ModuleType, tiny_model_dirs: dict[str, Path]
) -> None:
    target, _ = load(batched_config(tiny_model_dirs))
    with pytest.raises(AssertionError, match="invalid input prompt length"):  # base.py line 508
        target.model.forward(
            prompt(65).view(1, -1),
            cache_ids=torch.arange(65).view(1, -1),
            start_ids=torch.tensor([1], dtype=torch.int32),
        )


# ---------------------------------------------------------------- loading


def test_loads_every_model_with_continuous_batching_and_windows_for_the_batch(
    neuronx: ModuleType, tiny_model_dirs: dict[str, Path]
) -> None:
    target, draft = load(batched_config(tiny_model_dirs, draft=True))
    loaded = {who: d for who, call, d in neuronx.RUNTIME.events if call == "from_pretrained"}
    for backend, label in ((target, "tiny-target"), (draft, "tiny-draft")):
        assert isinstance(backend, BatchedNeuronBackend) and backend.slots == SLOTS
        assert {name: value for name, value in loaded[label].items() if name != "neuron_config"} == {
            "n_positions": 128,
            "batch_size": SLOTS,
            "amp": "f32",
            "tp_degree": 2,
        }
        neuron = loaded[label]["neuron_config"]
        assert neuron.continuous_batching.batch_size_for_shared_caches == SLOTS and neuron.use_2d_cache_ids
        assert backend.model.ignored_kwargs == {}
    ((_, _, enabled),) = [e for e in neuronx.RUNTIME.events if e[1] == "enable_speculative_decoder"]
    assert enabled == {"speculation_length": K, "batch_sizes": SLOTS}
    assert (target.max_score_width, draft.max_score_width) == (K, 1)


def test_compiled_batched_models_are_kept_apart_and_reused(
    neuronx: ModuleType, tiny_model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    """A continuous-batching model's networks differ from a batch-1 one's (context at batch 1, windows at B), so
    its manifest says so; a load of the same config reuses them."""
    config = batched_config(tiny_model_dirs, draft=True, neuron={"compiled_dir": str(tmp_path / "compiled")})
    results = compile_models(config, plan_deployment(config), [K])
    for result in results:
        constructor = json.loads((Path(result.location) / MANIFEST).read_text())["constructor"]
        assert constructor["batch_size"] == SLOTS and constructor["continuous_batching"] == SLOTS
    neuronx.RUNTIME.events.clear()
    target, draft = load(config)
    assert [d["directory"] for _, call, d in neuronx.RUNTIME.events if call == "load"] == [
        result.location for result in results
    ]
    assert "compile" not in neuronx.RUNTIME.calls()
    assert (target.slots, draft.slots) == (SLOTS, SLOTS)


def test_batch_above_one_is_refused_on_the_0_10_generation(
    neuronx_sdk_2_18: ModuleType, tiny_model_dirs: dict[str, Path]
) -> None:
    with pytest.raises(UsageError) as error:
        load(batched_config(tiny_model_dirs, draft=True, slots=2))
    assert [(p.field, p.value) for p in error.value.problems] == [("target.batch_size", 2), ("draft.batch_size", 2)]
    problem = error.value.problems[0]
    assert "the installed transformers-neuronx 0.10.0.21, which behaves as 0.10 (SDK 2.18; 7a30b42)" in problem.rule
    assert "no batch_sizes=, base.py:76 at 7a30b42" in problem.rule
    assert problem.fix.startswith("set target.batch_size: 1, or install transformers-neuronx 0.11-0.12")
    assert neuronx_sdk_2_18.RUNTIME.calls() == []  # refused before any model was built


# ---------------------------------------------------------------- one call, every row


def test_rows_scored_together_equal_each_row_scored_alone(
    neuronx: ModuleType, tiny_model_dirs: dict[str, Path]
) -> None:
    target, _ = load(batched_config(tiny_model_dirs))
    prompts = {0: prompt(6, seed=1), 1: prompt(9, seed=2), 3: prompt(3, seed=3)}
    for slot, ids in prompts.items():
        target.prefill_slot(slot, ids)
    segments = [
        Segment(3, 3, torch.tensor([11, 12, 13, 14])),
        Segment(0, 6, torch.tensor([21, 22])),
        Segment(1, 9, torch.tensor([31])),
    ]  # slot 2 free
    together = target.score_batch(segments)
    assert together.shape == (7, VOCAB) and together.dtype == torch.float32
    alone = torch.cat([target.score_batch([segment]) for segment in segments])
    assert torch.equal(together, alone)
    rows = together.split([4, 2, 1])
    for segment, logits in zip(segments, rows, strict=True):
        tokens = prompts[segment.slot].tolist() + segment.tokens.tolist()
        expected = reference(tiny_model_dirs["target"], tokens, range(segment.start, len(tokens)))
        assert torch.allclose(logits, expected, atol=1e-5)


def test_the_cache_ids_start_ids_and_attention_each_row_gets_through_rejections(
    neuronx: ModuleType, tiny_model_dirs: dict[str, Path]
) -> None:
    target, _ = load(batched_config(tiny_model_dirs, neuron={"self_test": False}))
    first, third = prompt(6, seed=1), prompt(4, seed=2)
    neuronx.RUNTIME.events.clear()
    target.prefill_slot(0, first)
    target.prefill_slot(2, third)
    a = target.score_batch([Segment(0, 6, torch.tensor([40, 41, 42, 43])), Segment(2, 4, torch.tensor([50, 51]))])
    # slot 0 keeps 40, 41 (its next window starts at 8); slot 2 rejects 51 (its next starts at 5)
    b = target.score_batch([Segment(0, 8, torch.tensor([44, 45, 46, 47])), Segment(2, 5, torch.tensor([52]))])
    c = target.score_batch([Segment(0, 12, torch.tensor([48])), Segment(2, 6, torch.tensor([53]))])  # one token each
    d = target.score_batch([Segment(2, 7, torch.tensor([54, 55]))])  # slot 0's row has left
    assert sent(neuronx) == [
        ("forward", [list(range(6))], [0], [first.tolist()], [0]),  # context encoding: the slot's own bucket
        ("forward", [list(range(4))], [2], [third.tolist()], [0]),
        (
            "speculative_forward",
            [[6, 7, 8, 9], [1, 2, 3, 4], [4, 5, 6, 7], [1, 2, 3, 4]],
            [0, 1, 2, 3],
            [[40, 41, 42, 43], [0, 0, 0, 0], [50, 51, 51, 51], [0, 0, 0, 0]],
            [6, 1, 4, 1],
        ),
        (
            "speculative_forward",
            [[8, 9, 10, 11], [1, 2, 3, 4], [5, 6, 7, 8], [1, 2, 3, 4]],
            [0, 1, 2, 3],
            [[44, 45, 46, 47], [0, 0, 0, 0], [52, 52, 52, 52], [0, 0, 0, 0]],
            [8, 1, 5, 1],
        ),
        ("forward", [[12], [0], [6], [0]], [0, 1, 2, 3], [[48], [0], [53], [0]], [12, 0, 6, 0]),
        (
            "speculative_forward",
            [[13, 14, 15, 16], [1, 2, 3, 4], [7, 8, 9, 10], [1, 2, 3, 4]],
            [0, 1, 2, 3],
            [[0, 0, 0, 0], [0, 0, 0, 0], [54, 55, 55, 55], [0, 0, 0, 0]],
            [13, 1, 7, 1],
        ),
    ]
    row0 = first.tolist() + [40, 41, 44, 45, 46, 47, 48]
    row2 = third.tolist() + [50, 52, 53, 54, 55]
    model = tiny_model_dirs["target"]
    assert torch.allclose(
        torch.cat([a[:4], b[:4], c[:1]]),
        torch.cat(
            [reference(model, first.tolist() + [40, 41, 42, 43], range(6, 10)), reference(model, row0, range(8, 13))]
        ),
        atol=1e-5,
    )
    assert torch.allclose(
        torch.cat([a[4:5], b[4:], c[1:], d]),
        torch.cat([reference(model, third.tolist() + [50], range(4, 5)), reference(model, row2, range(5, 9))]),
        atol=1e-5,
    )


def test_a_prompt_joining_between_steps_leaves_the_running_rows_alone(
    neuronx: ModuleType, tiny_model_dirs: dict[str, Path]
) -> None:
    target, _ = load(batched_config(tiny_model_dirs, neuron={"self_test": False}))
    running = prompt(6, seed=1)
    target.prefill_slot(0, running)
    target.score_batch([Segment(0, 6, torch.tensor([40, 41, 42, 43]))])
    neuronx.RUNTIME.events.clear()
    joined = target.prefill_slot(1, prompt(5, seed=2))
    single = target.prefill_slot(2, torch.tensor([60]))  # one token: a full batch, not the library's padding
    after = target.score_batch(
        [Segment(0, 10, torch.tensor([44, 45])), Segment(1, 5, torch.tensor([61])), Segment(2, 1, torch.tensor([62]))]
    )
    assert sent(neuronx)[:2] == [
        ("forward", [list(range(5))], [1], [prompt(5, seed=2).tolist()], [0]),
        ("forward", [[10], [5], [0], [0]], [0, 1, 2, 3], [[0], [0], [60], [0]], [10, 5, 0, 0]),
    ]
    model = tiny_model_dirs["target"]
    assert torch.allclose(joined, reference(model, prompt(5, seed=2).tolist(), range(4, 5))[0], atol=1e-5)
    assert torch.allclose(single, reference(model, [60], range(0, 1))[0], atol=1e-5)
    expected = torch.cat(
        [
            reference(model, running.tolist() + [40, 41, 42, 43, 44, 45], range(10, 12)),
            reference(model, prompt(5, seed=2).tolist() + [61], range(5, 6)),
            reference(model, [60, 62], range(1, 2)),
        ]
    )
    assert torch.allclose(after, expected, atol=1e-5)


def test_a_prompt_past_the_largest_context_bucket_is_finished_in_windows(
    neuronx: ModuleType, tiny_model_dirs: dict[str, Path]
) -> None:
    """n_positions 128: context buckets end at 64 (bucket.py), so a 70-token prompt is 64 + two windows."""
    target, _ = load(batched_config(tiny_model_dirs, neuron={"self_test": False}))
    target.prefill_slot(0, prompt(6, seed=1))
    long = prompt(70, seed=2)
    neuronx.RUNTIME.events.clear()
    logits = target.prefill_slot(3, long)
    calls = sent(neuronx)
    assert [(call, cache_ids[3] if len(cache_ids) == SLOTS else cache_ids) for call, cache_ids, *_ in calls] == [
        ("forward", [list(range(64))]),
        ("speculative_forward", [64, 65, 66, 67]),
        ("speculative_forward", [68, 69, 70, 71]),
    ]
    assert torch.allclose(logits, reference(tiny_model_dirs["target"], long.tolist(), range(69, 70))[0], atol=1e-5)


def test_padding_past_the_last_position_lands_on_it(neuronx: ModuleType, tiny_model_dirs: dict[str, Path]) -> None:
    """The last position is read only by the call that writes it (a window reads below its smallest cache id)."""
    target, _ = load(batched_config(tiny_model_dirs, neuron={"self_test": False}))
    long = torch.arange(126) % 90 + 3
    target.prefill_slot(1, long)  # 64 by context encoding, the rest in windows
    neuronx.RUNTIME.events.clear()
    logits = target.score_batch([Segment(1, 126, torch.tensor([7, 8]))])
    ((call, cache_ids, *_),) = sent(neuronx)
    assert (call, cache_ids[1]) == ("speculative_forward", [126, 127, 127, 127])
    tokens = long.tolist() + [7, 8]
    assert torch.allclose(logits, reference(tiny_model_dirs["target"], tokens, range(126, 128)), atol=1e-5)


# ---------------------------------------------------------------- the batching loop on a batched target


PROMPTS = [
    torch.tensor(p)
    for p in (
        [5, 6, 7, 8, 5, 6, 7, 8, 5, 6],
        [9, 10, 11, 9, 10, 11, 9],
        [4, 20, 4, 20, 4],
        [30, 31, 32, 33, 34, 35],
        [12],
    )
]
BUDGETS = [14, 9, 17, 6, 11]


@pytest.mark.parametrize(("drafter", "policy"), [("ngram", "fixed"), ("model", "fixed"), ("ngram", "cost")])
def test_every_row_equals_its_batch_1_output_with_rows_joining_and_leaving(
    neuronx: ModuleType, tiny_model_dirs: dict[str, Path], drafter: str, policy: str
) -> None:
    """Cost: the whole batch speculates at k or takes one token, as the loop decides on compiled shapes."""
    greedy = SamplingConfig(temperature=0.0)
    single, _ = load(neuron_config(tiny_model_dirs["target"], neuron={"self_test": False}))
    alone = [plain_generate(single, ids, budget, greedy).tokens for ids, budget in zip(PROMPTS, BUDGETS, strict=True)]
    target, draft = load(
        batched_config(tiny_model_dirs, draft=drafter == "model", slots=3, neuron={"self_test": False})
    )
    params = sampling_params(greedy)

    def drafter_for(slot: int):
        return ModelDrafter(SlotView(draft, slot), params, torch.Generator()) if draft else NgramDrafter(VOCAB)

    cost, counts = WidthCost({1: 10.0, K: 11.0}), AcceptanceModel()
    loop = ContinuousBatchLoop(target, K, cost if policy == "cost" else None)
    pending = [
        RowRequest(
            ids,
            budget,
            settings=RowSettings(
                params,
                drafter_for=drafter_for,
                acceptor=GreedyAcceptor(),
                policy=CostPolicy(K, cost, counts) if policy == "cost" else FixedPolicy(K),
            ),
        )
        for ids, budget in zip(PROMPTS, BUDGETS, strict=True)
    ]
    outputs: dict[int, list[int]] = {}
    running: dict[Any, int] = {}
    queue = list(enumerate(pending))
    widths = []
    while queue or loop.rows:
        while queue and loop.free_slots:
            index, request = queue.pop(0)
            running[loop.join(request)] = index
        widths.append(len(loop.rows))
        for row in loop.step():
            assert row.error is None, row.error
            outputs[running.pop(row)] = row.result().tokens
    assert [outputs[i] for i in range(len(PROMPTS))] == alone
    assert max(widths) == 3 and loop.free_slots == 3
    windows = [cache_ids for call, cache_ids, *_ in sent(neuronx) if call == "speculative_forward"]
    assert windows and all(len(rows) == 3 and all(len(row) == K for row in rows) for rows in windows)


@pytest.mark.parametrize("drafter", ["ngram", "model"])
def test_a_freed_slot_leaves_the_bucket_to_the_running_rows(
    neuronx: ModuleType, tiny_model_dirs: dict[str, Path], drafter: str
) -> None:
    """n_positions 256: token buckets 128 and 256, and a call runs the first that holds the largest cache id of ANY
    of its rows (decoder.py:490, :538-546 at 1ade6d7). A row that reached position 140 and left must not keep every
    later call of a short row in the 256 bucket: its slot is parked where it costs nothing."""
    sizes = {"n_positions": 256, "batch_size": 2}
    config = neuron_config(
        tiny_model_dirs["target"],
        tiny_model_dirs["draft"] if drafter == "model" else None,
        target=sizes,
        **({"draft": sizes} if drafter == "model" else {}),
        neuron={"self_test": False},
    )
    target, draft = load(config)
    params = sampling_params(SamplingConfig())

    def drafter_for(slot: int):
        return ModelDrafter(SlotView(draft, slot), params, torch.Generator()) if draft else NgramDrafter(VOCAB)

    def request(ids: torch.Tensor, budget: int) -> RowRequest:
        settings = RowSettings(params, drafter_for=drafter_for, acceptor=GreedyAcceptor(), policy=FixedPolicy(K))
        return RowRequest(ids, budget, settings=settings)

    loop = ContinuousBatchLoop(target, K)
    long = loop.join(request(torch.arange(138) % 90 + 3, 4))
    short = loop.join(request(prompt(8), 40))
    while not long.finished:
        loop.step()
    neuronx.RUNTIME.events.clear()
    while not short.finished:
        loop.step()
    assert short.error is None and long.error is None
    calls = [(who, d["bucket"]) for who, _, d in neuronx.RUNTIME.events if "bucket" in d]
    assert calls and {bucket for _, bucket in calls} == {128}, calls
    assert {who for who, _ in calls} == ({"tiny-target", "tiny-draft"} if draft else {"tiny-target"})
