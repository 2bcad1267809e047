"""`engine: library`: transformers-neuronx's own loop (stand-in port) driven with our acceptors."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
import torch
from neuron_support import neuron_config, prompt

from neuron_ssp.backends.neuron.api import load_neuronx
from neuron_ssp.backends.neuron.load import load_neuron_backends
from neuron_ssp.engines.base import sampling_params
from neuron_ssp.engines.library import LibraryEngine, LibraryLane, LibraryLanes, adapt_acceptor
from neuron_ssp.engines.native import plain_generate
from neuron_ssp.errors import RuntimeProblem, UsageError
from neuron_ssp.speculation.acceptors import GreedyAcceptor, ProbabilisticAcceptor, TypicalAcceptor
from neuron_ssp.speculation.position_noise import PositionNoise
from neuron_ssp.topology import plan_deployment

pytest_plugins = ["neuron_fixtures"]  # fixtures: neuronx, neuronx_any, tiny_model_dirs


def engine_for(config, acceptor) -> tuple[LibraryEngine, object]:
    target, draft = load_neuron_backends(config, plan_deployment(config))
    return LibraryEngine.from_config(config, target, draft, acceptor), target


@pytest.mark.parametrize("same_models", [False, True])
def test_library_loop_with_our_greedy_acceptor_equals_plain_greedy(
    neuronx_any: ModuleType, tiny_model_dirs: dict[str, Path], same_models: bool
) -> None:
    draft_dir = tiny_model_dirs["target"] if same_models else tiny_model_dirs["draft"]
    config = neuron_config(tiny_model_dirs["target"], draft_dir, speculation={"engine": "library"})
    engine, target = engine_for(config, GreedyAcceptor())
    ids = prompt(7)
    result = engine.generate(ids, 24)
    assert result.tokens == plain_generate(target, ids, 24, config.sampling).tokens
    stats = result.stats
    assert stats.new_tokens == 24 and stats.target_calls > 0 and stats.time_target_s > 0
    if same_models:
        assert stats.acceptance_rate == 1.0


def test_library_loop_stops_at_eos(neuronx: ModuleType, tiny_model_dirs: dict[str, Path]) -> None:
    config = neuron_config(tiny_model_dirs["target"], tiny_model_dirs["draft"], speculation={"engine": "library"})
    engine, target = engine_for(config, GreedyAcceptor())
    ids = prompt(7)
    plain = plain_generate(target, ids, 24, config.sampling).tokens
    eos = plain[5]
    result = engine.generate(ids, 24, eos_token_ids={eos})
    assert result.tokens == plain[: plain.index(eos) + 1]


def test_every_eos_of_the_model_stops_the_library_loop(neuronx: ModuleType, tiny_model_dirs: dict[str, Path]) -> None:
    """The library takes one eos_token_id; a second EOS (Llama-3 has several) must stop its loop too."""
    config = neuron_config(tiny_model_dirs["target"], tiny_model_dirs["draft"], speculation={"engine": "library"})
    engine, target = engine_for(config, GreedyAcceptor())
    ids = prompt(7)
    plain = plain_generate(target, ids, 24, config.sampling).tokens
    other_eos = plain[5]
    assert target.model.config.eos_token_id == 2 and other_eos != 2
    neuronx.RUNTIME.events.clear()
    result = engine.generate(ids, 24, eos_token_ids={2, other_eos})
    assert result.tokens == plain[: plain.index(other_eos) + 1]  # the real id, not the one the library saw
    windows = [d["cache_ids"] for _, c, d in neuronx.RUNTIME.events if c == "speculative_forward"]
    assert max(slot for w in windows for slot in w) < len(ids) + 12  # stopped near the EOS, not at 24 tokens


def test_the_draft_needs_p_plus_n_plus_k_minus_1_positions(
    neuronx: ModuleType, tiny_model_dirs: dict[str, Path]
) -> None:
    """Measured on the port of the 0.13 loop: draft = target accepts every window; the loop scores one
    window past the budget (from P+N-1: the target's last slot is P+N+k-2), and after a full window the draft is
    fed at cache_ids - 1, one slot past the window (speculation.py at 1ade6d7). A row alone stops that last window
    after one token (its budget is spent), so its draft stays a slot below; in a batch another row's full
    window takes it there (test_neuron_library_batched.py)."""
    k, ids = 4, prompt(7)
    new = 1 + 29 * k  # windows end exactly at the budget: the last one starts at P+N-1
    needed = len(ids) + new + k - 1
    model = {"n_positions": needed}
    config = neuron_config(
        tiny_model_dirs["target"],
        tiny_model_dirs["target"],
        speculation={"engine": "library"},
        target=model,
        draft=model,
    )
    engine, _ = engine_for(config, GreedyAcceptor())
    neuronx.RUNTIME.events.clear()
    assert len(engine.generate(ids, new).tokens) == new
    draft_label = engine.draft.model.label
    draft_slots = [
        slot
        for who, c, d in neuronx.RUNTIME.events
        if who == draft_label and c == "forward"
        for slot in d["cache_ids"] or []
    ]
    target_slots = [slot for _, c, d in neuronx.RUNTIME.events if c == "speculative_forward" for slot in d["cache_ids"]]
    assert max(target_slots) == needed - 1  # P+N+k-2: exactly the room asked for
    assert max(draft_slots) == needed - 2

    short = neuron_config(
        tiny_model_dirs["target"],
        tiny_model_dirs["target"],
        speculation={"engine": "library"},
        target=model,
        draft={"n_positions": needed - 1},
    )
    engine, _ = engine_for(short, GreedyAcceptor())
    neuronx.RUNTIME.events.clear()
    with pytest.raises(UsageError) as caught:  # refused before the first call, not half-way (StopIteration)
        engine.generate(ids, new)
    assert caught.value.problems[0].field == "draft.n_positions"
    assert not [c for _, c, _ in neuronx.RUNTIME.events if c in ("forward", "speculative_forward")]


def test_the_older_library_warns_that_it_finishes_greedily(
    neuronx_any: ModuleType, tiny_model_dirs: dict[str, Path]
) -> None:
    config = neuron_config(
        tiny_model_dirs["target"],
        tiny_model_dirs["draft"],
        speculation={"engine": "library", "acceptor": "probabilistic"},
        sampling={"temperature": 0.9},
    )
    target, draft = load_neuron_backends(config, plan_deployment(config))
    rng = torch.Generator()
    with pytest.warns(UserWarning) as caught:
        LibraryEngine.from_config(config, target, draft, ProbabilisticAcceptor(sampling_params(config.sampling), rng))
    greedy_tail = any("last <= k tokens greedily" in str(w.message) for w in caught)
    assert greedy_tail == (neuronx_any.API == "sdk_2_18")


def test_library_loop_samples_with_our_probabilistic_acceptor(
    neuronx_any: ModuleType, tiny_model_dirs: dict[str, Path]
) -> None:
    config = neuron_config(
        tiny_model_dirs["target"],
        tiny_model_dirs["draft"],
        speculation={"engine": "library", "acceptor": "probabilistic"},
        sampling={"temperature": 0.9, "seed": 3},
    )
    rng = torch.Generator()
    target, draft = load_neuron_backends(config, plan_deployment(config))
    with pytest.warns(UserWarning, match="first token"):
        engine = LibraryEngine.from_config(
            config, target, draft, ProbabilisticAcceptor(sampling_params(config.sampling), rng), rng
        )
    first, second = engine.generate(prompt(7), 16), engine.generate(prompt(7), 16)
    assert len(first.tokens) == 16 and first.tokens == second.tokens
    assert 0 <= first.stats.acceptance_rate <= 1 and first.stats.draft_tokens > 0


def one_lane(acceptor, api, k: int, vocab: int, stop_id: int | None = None) -> LibraryLanes:
    """Our acceptor as the library sees it, for one row with room to spare."""
    return LibraryLanes(
        [LibraryLane(acceptor, PositionNoise(0), frozenset(), remaining=99, live=True)],
        k,
        vocab,
        stop_id,
        api.batched_acceptor,
    )


def test_adapter_shapes_for_each_api_generation(neuronx_any: ModuleType) -> None:
    api = load_neuronx()
    vocab, k = 10, 4
    draft_ids = torch.tensor([[3, 4, 5]])
    target = torch.full((k, vocab), -10.0)
    target[torch.arange(k), torch.tensor([3, 4, 7, 1])] = 10.0  # agrees on 3 and 4, then prefers 7
    adapter = adapt_acceptor(api, one_lane(GreedyAcceptor(), api, k, vocab))
    assert isinstance(adapter, api.speculation.TokenAcceptor)
    if api.batched_acceptor:
        out = adapter(draft_ids, torch.zeros(1, 3, vocab), target.unsqueeze(0))
        assert out.tolist() == [[3, 4, 7, 0]]  # zero-padded to k, as count_nonzero expects
    else:
        out = adapter(draft_ids, torch.zeros(3, vocab), target)
        assert out.tolist() == [[3, 4, 7]]


def test_an_accepted_token_zero_is_refused_rather_than_miscounted(neuronx: ModuleType) -> None:
    api = load_neuronx()
    lanes = one_lane(lambda ids, d, t: torch.tensor([[0, 5]]), api, 4, 10, stop_id=2)
    out = adapt_acceptor(api, lanes)(torch.tensor([[0, 1, 2]]), torch.zeros(1, 3, 10), torch.zeros(1, 4, 10))
    (lane,) = lanes.lanes
    assert isinstance(lane.error, RuntimeProblem) and "count_nonzero" in str(lane.error)
    assert out.tolist() == [[2, 0, 0, 0]] and not lane.live  # the row stops at the EOS id, not at a miscount


def test_the_draft_distribution_given_to_the_acceptor_is_the_greedy_draft_point_mass(
    neuronx: ModuleType,
) -> None:
    seen = {}

    def spy(ids: torch.Tensor, draft_scores: torch.Tensor, target_scores: torch.Tensor) -> torch.Tensor:
        seen["probs"] = draft_scores.softmax(-1)
        return ids[:, :1]

    api = load_neuronx()
    adapter = adapt_acceptor(api, one_lane(spy, api, 3, 6))
    adapter(torch.tensor([[4, 2]]), torch.randn(1, 2, 6), torch.randn(1, 3, 6))
    assert torch.equal(seen["probs"], torch.nn.functional.one_hot(torch.tensor([[4, 2]]), 6).float())


def test_settings_the_library_loop_cannot_honour_are_refused(
    neuronx: ModuleType, tiny_model_dirs: dict[str, Path]
) -> None:
    config = neuron_config(tiny_model_dirs["target"], speculation={"engine": "library", "policy": "adaptive"})
    target, _ = load_neuron_backends(config, plan_deployment(config))
    with pytest.raises(UsageError) as error:
        LibraryEngine.from_config(config, target, None, TypicalAcceptor())
    assert {p.field for p in error.value.problems} == {"speculation.drafter", "speculation.policy"}


def test_the_library_engine_needs_the_neuron_backend(tiny_model_dirs: dict[str, Path]) -> None:
    config = neuron_config(
        tiny_model_dirs["target"],
        tiny_model_dirs["draft"],
        platform={"backend": "torch"},
        speculation={"engine": "library"},
    )
    with pytest.raises(UsageError, match="Neuron models only"):
        LibraryEngine.from_config(config, None, None, GreedyAcceptor())  # type: ignore[arg-type]


def test_validate_warns_when_token_zero_is_an_ordinary_token(tiny_model_dirs: dict[str, Path], tmp_path: Path) -> None:
    import json
    import shutil

    from neuron_ssp.topology import validate_config

    def warnings_for(target_dir: Path, engine: str) -> list[str]:
        config = neuron_config(target_dir, tiny_model_dirs["draft"], speculation={"engine": engine})
        return [p.fix for p in validate_config(config).warnings if p.field == "speculation.engine"]

    ordinary = tmp_path / "llama3-like"
    shutil.copytree(tiny_model_dirs["target"], ordinary)
    (ordinary / "tokenizer.json").write_text(
        json.dumps(
            {
                "added_tokens": [{"id": 95, "content": "<|eot_id|>", "special": True}],
                "model": {"vocab": {"!": 0, "a": 1}},
            }
        )
    )
    special = tmp_path / "llama2-like"
    shutil.copytree(tiny_model_dirs["target"], special)
    (special / "tokenizer.json").write_text(
        json.dumps({"added_tokens": [{"id": 0, "content": "<unk>", "special": True}], "model": {"vocab": {"<unk>": 0}}})
    )
    (fix,) = warnings_for(ordinary, "library")
    assert "native" in fix and "fused" in fix
    assert warnings_for(ordinary, "native") == [] and warnings_for(special, "library") == []
