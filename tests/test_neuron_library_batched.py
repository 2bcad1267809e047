"""`engine: library` at batch > 1: transformers-neuronx's own SpeculativeGenerator loop (a stand-in port of 1ade6d7)
over a static batch of rows: each row's output that of the row alone, the calls as the real signatures take them.
(`engine: fused` at batch > 1 batches continuously: tests/test_neuron_fused_rows.py.)"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from types import ModuleType

import pytest
import torch
from neuron_support import STANDIN, VOCAB, neuron_config, prompt

from neuron_ssp.backends.neuron.api import load_neuronx
from neuron_ssp.backends.neuron.load import load_neuron_backends
from neuron_ssp.backends.neuron.scoring import NeuronBackend
from neuron_ssp.config import SamplingConfig
from neuron_ssp.engines.base import sampling_params
from neuron_ssp.engines.library import LibraryEngine
from neuron_ssp.engines.rows import RowCallbacks, RowRequest, RowSettings
from neuron_ssp.errors import RuntimeProblem, UsageError
from neuron_ssp.speculation.acceptors import GreedyAcceptor, ProbabilisticAcceptor, ZeroPaddedAcceptor
from neuron_ssp.topology import plan_deployment

pytest_plugins = ["neuron_fixtures"]  # fixtures: neuronx, neuronx_any, tiny_model_dirs
SIGNATURES = json.loads((STANDIN / "neuronx_signatures.json").read_text())
K = 4
N_POSITIONS = 128
GREEDY = SamplingConfig()


def real_names(generation: str, qualified: str) -> set[str]:
    return {p["name"] for p in SIGNATURES[generation][qualified] if p["kind"] != "var_keyword"}


def batched_model(
    path: Path,
    batch: int,
    k: int | None = None,
    padding_side: str = "right",
    n_positions: int = N_POSITIONS,
    **neuron: object,
):
    """A LlamaForSampling compiled for `batch` rows, as the batched loops need it (right padding: 2-D cache_ids)."""
    from transformers_neuronx import LlamaForSampling
    from transformers_neuronx.config import NeuronConfig

    model = LlamaForSampling.from_pretrained(
        str(path),
        batch_size=batch,
        n_positions=n_positions,
        tp_degree=2,
        amp="f32",
        neuron_config=NeuronConfig(padding_side=padding_side, **neuron),
    )
    if k is not None:
        model.enable_speculative_decoder(k, batch_sizes=batch)
    model.to_neuron()
    return model


def library_engine(dirs: dict[str, Path], batch: int, n_positions: int = N_POSITIONS) -> LibraryEngine:
    target = NeuronBackend(
        batched_model(dirs["target"], batch, K, n_positions=n_positions), "target", VOCAB, n_positions, K
    )
    draft = NeuronBackend(
        batched_model(dirs["draft"], batch, n_positions=n_positions), "draft", VOCAB, n_positions, None
    )
    return LibraryEngine(target, draft, GreedyAcceptor(), GREEDY, K, api=load_neuronx(), batch_size=batch)


def library_alone(
    dirs: dict[str, Path],
    ids: torch.Tensor,
    new: int,
    eos=frozenset(),
    sampling: dict | None = None,
    n_positions: int = N_POSITIONS,
):
    """The request through `engine: library` as configured today: batch 1, loaded by the pipeline's loader."""
    speculation = {"engine": "library", "acceptor": "probabilistic" if sampling else "greedy"}
    sizes = {"n_positions": n_positions}
    config = neuron_config(
        dirs["target"], dirs["draft"], speculation=speculation, sampling=sampling or {}, target=sizes, draft=sizes
    )
    target, draft = load_neuron_backends(config, plan_deployment(config))
    acceptor = ProbabilisticAcceptor(sampling_params(config.sampling)) if sampling else GreedyAcceptor()
    return LibraryEngine.from_config(config, target, draft, acceptor).generate(ids, new, eos)


def request(
    ids: torch.Tensor, new: int, eos=(), acceptor=None, sampling: SamplingConfig = GREEDY, **callbacks: object
) -> RowRequest:
    settings = RowSettings(sampling_params(sampling), sampling.seed, acceptor=acceptor or GreedyAcceptor())
    return RowRequest(ids, new, eos, settings, RowCallbacks(**callbacks))  # type: ignore[arg-type]


class CappedGreedy(GreedyAcceptor):
    """Greedy acceptance keeping at most `cap` drafts: lossless (a shorter accepted prefix), so rows of one batch
    accept different numbers of drafts per call and commit the same tokens."""

    def __init__(self, cap: int):
        super().__init__()
        self.cap = cap

    def __call__(self, draft_ids, draft_scores, target_scores):
        return super().__call__(draft_ids[:, : self.cap], draft_scores[:, : self.cap], target_scores[:, : self.cap + 1])


def self_drafted(dirs: dict[str, Path]) -> dict[str, Path]:
    return {"target": dirs["target"], "draft": dirs["target"]}


CASES = [(prompt(5, seed=1), 20), (prompt(13, seed=2), 9), (prompt(9, seed=3), 30)]  # lengths and budgets differ


def test_each_rows_greedy_output_is_the_rows_alone(neuronx: ModuleType, tiny_model_dirs: dict[str, Path]) -> None:
    """Rows at different positions accepting different numbers of drafts per call (the draft is the target: each
    row keeps all its acceptor allows). transformers-neuronx continues every row from the token at row 0's
    accepted length (speculation.py:836-838): without the engine's common length, row 1 repeats a token."""
    dirs = self_drafted(tiny_model_dirs)
    expected = [library_alone(dirs, ids, new).tokens for ids, new in CASES]
    loop = library_engine(dirs, 3).row_loop()
    committed: list[list[tuple[list[int], int | None, int]]] = [[], [], []]
    rows = [
        loop.join(
            request(ids, new, acceptor=CappedGreedy(cap), on_commit=lambda t, d, n, i=i: committed[i].append((t, d, n)))
        )
        for i, ((ids, new), cap) in enumerate(zip(CASES, (1, 2, K - 1), strict=True))
    ]
    assert loop.free_slots == 0
    with pytest.raises(RuntimeError, match="no free slot"):
        loop.join(request(prompt(4), 4))
    finished = loop.step()
    assert finished == rows and not loop.rows and loop.free_slots == 3
    for row, want, pieces in zip(rows, expected, committed, strict=True):
        assert row.error is None and row.finished
        assert row.seq.generated() == want
        assert [t for tokens, _, _ in pieces for t in tokens] == want  # the callbacks saw every token once
        assert pieces[0][1:] == (0, 0) and all(drafted == K - 1 for _, _, drafted in pieces[1:])
        assert row.stats.new_tokens == len(want) and row.stats.target_calls == len(pieces) - 1
    # the draft is the target, so every draft a row kept was right: each row drafts from its own position (the
    # library's DraftModelForSpeculation drafts rows at row 0's: speculation.py:335, :356; measured 0.31 here)
    assert rows[2].stats.acceptance_rate == 1.0 and rows[2].stats.accepted_tokens > 0


def test_the_calls_are_the_ones_the_real_loop_takes(
    neuronx: ModuleType, tiny_model_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """sample() gets right-padded prompts, their mask and sequence ids (speculation.py:718-730 at 1ade6d7), under
    the real signature's names; the models get the 2-D cache_ids the loop derives, each row at its own positions."""
    from transformers_neuronx import speculation

    sent: list[dict] = []
    real_sample = speculation.SpeculativeGenerator.sample

    @functools.wraps(real_sample)  # the signature stays the real one: the engine reads the API from it
    def spy(self, input_ids, **kwargs):
        sent.append({"input_ids": input_ids, **kwargs})
        return real_sample(self, input_ids, **kwargs)

    monkeypatch.setattr(speculation.SpeculativeGenerator, "sample", spy)
    engine = library_engine(tiny_model_dirs, 3)
    loop = engine.row_loop()
    (short, short_new), (long, long_new) = CASES[0], CASES[1]
    loop.join(request(short, short_new))
    loop.join(request(long, long_new))
    neuronx.RUNTIME.events.clear()
    loop.step()

    ((call,),) = [sent]
    assert set(call) - {"input_ids"} <= real_names("sdk_2_21", "SpeculativeGenerator.sample")
    width = len(long)
    assert call["input_ids"].shape == (3, width)  # padded to the compiled batch with a one-token line
    assert call["input_ids"][0, : len(short)].tolist() == short.tolist()
    assert call["input_ids"][1].tolist() == long.tolist()
    assert call["attention_mask"].tolist() == [
        [1] * len(short) + [0] * (width - len(short)),
        [1] * width,
        [1] + [0] * (width - 1),
    ]
    assert call["start_ids"].tolist() == [0, 1, 2]
    assert call["sequence_length"] == max(len(short) + short_new, len(long) + long_new)

    target, draft = engine.target.model.label, engine.draft.model.label
    contexts = [d for who, c, d in neuronx.RUNTIME.events if who == target and c == "forward"]
    assert contexts[0]["cache_ids"][0] == [i if i < len(short) else 0 for i in range(width)]  # arange x mask
    assert contexts[0]["start_ids"] == [0, 1, 2]
    windows = [d for who, c, d in neuronx.RUNTIME.events if who == target and c == "speculative_forward"]
    first = windows[0]["cache_ids"]
    assert first[0] == list(range(len(short), len(short) + K)) and first[1] == list(range(width, width + K))
    steps = [d["cache_ids"] for who, c, d in neuronx.RUNTIME.events if who == draft and c == "forward"][1:K]
    assert steps == [[[len(short) + s], [width + s], [1 + s]] for s in range(K - 1)]  # each row from its own position


def test_an_eos_ends_its_row_only(neuronx: ModuleType, tiny_model_dirs: dict[str, Path]) -> None:
    """Two EOS ids (the model config's 2 and another): the library stops at one, so the other is rewritten for
    it and put back; the rows without it run to their budgets."""
    dirs = self_drafted(tiny_model_dirs)
    ended = library_alone(dirs, *CASES[2]).tokens
    other = ended[4]
    eos = {2, other}
    expected = [library_alone(dirs, ids, new, eos).tokens for ids, new in CASES]
    assert expected[2][-1] == other and len(expected[2]) == 5
    loop = library_engine(dirs, 3).row_loop()
    rows = [loop.join(request(ids, new, eos, acceptor=CappedGreedy(2))) for ids, new in CASES]
    loop.step()
    assert [row.seq.generated() for row in rows] == expected
    assert [len(t) for t in expected[:2]] != [5, 5]  # the others were not cut with it


def test_sampled_rows_give_their_seeds_tokens_whatever_the_batch(
    neuronx: ModuleType, tiny_model_dirs: dict[str, Path]
) -> None:
    """Each row's acceptor draws from that row's per-position noise (the library hands our acceptor every row,
    speculation.py:817): a seeded row's tokens are those it gets alone."""
    settings = [SamplingConfig(temperature=0.9, seed=seed) for seed in (11, 12, 13)]
    with pytest.warns(UserWarning, match="first token"):
        expected = [
            library_alone(tiny_model_dirs, ids, new, sampling={"temperature": 0.9, "seed": s.seed}).tokens
            for (ids, new), s in zip(CASES, settings, strict=True)
        ]
    loop = library_engine(tiny_model_dirs, 3).row_loop()
    rows = [
        loop.join(request(ids, new, acceptor=ProbabilisticAcceptor(sampling_params(s)), sampling=s))
        for (ids, new), s in zip(CASES, settings, strict=True)
    ]
    loop.step()
    assert [row.seq.generated() for row in rows] == expected


def test_one_rows_failure_and_a_cancel_leave_the_others(neuronx: ModuleType, tiny_model_dirs: dict[str, Path]) -> None:
    dirs = self_drafted(tiny_model_dirs)
    expected = library_alone(dirs, *CASES[0]).tokens

    def broken(draft_ids, draft_scores, target_scores):
        return torch.tensor([[VOCAB - 1, VOCAB - 1, VOCAB - 1]])  # not the drafts it was given

    loop = library_engine(dirs, 3).row_loop()
    good = loop.join(request(*CASES[0]))
    bad = loop.join(request(*CASES[1], acceptor=broken))
    gone = loop.join(request(*CASES[2], should_stop=lambda: True))
    assert loop.step() == [gone, good, bad]
    assert gone.cancelled and gone.seq.generated() == []
    assert isinstance(bad.error, RuntimeProblem) and bad.error.problems[0].field == "speculation.acceptor"
    assert good.error is None and good.seq.generated() == expected


def test_a_request_is_refused_at_join_when_it_does_not_fit(
    neuronx: ModuleType, tiny_model_dirs: dict[str, Path]
) -> None:
    loop = library_engine(tiny_model_dirs, 2).row_loop()
    with pytest.raises(UsageError) as caught:
        loop.join(request(prompt(7), N_POSITIONS))
    assert caught.value.problems[0].field == "target.n_positions" and not loop.rows
    loop.join(request(prompt(N_POSITIONS // 2), 8))  # the largest context bucket, exactly
    with pytest.raises(UsageError) as caught:  # past the one context network a batch's prompts go through
        loop.join(request(prompt(N_POSITIONS // 2 + 1), 8))
    (problem,) = caught.value.problems
    assert problem.field == "prompt" and "base.py:246-249" in problem.rule and "target.batch_size: 1" in problem.fix


def test_a_prompt_that_fills_a_context_bucket_is_sent_at_that_width_and_leaves_the_shorter_rows_right(
    neuronx: ModuleType, tiny_model_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """At 256 positions the context buckets are 64 and 128. A batch exactly 64 wide runs the 64 bucket: its static
    context cache is sized to the bucket (decoder.py:919-936 at 1ade6d7) and replaced by index (llama/hlo.py:747-752),
    so the shorter row's padding (cache id 0: arange x mask) lands past its tokens, not on its slot 0. One column
    more would run the 128 bucket: another network to compile and a prefill twice as wide."""
    from transformers_neuronx import speculation

    widths: list[int] = []
    real_sample = speculation.SpeculativeGenerator.sample

    @functools.wraps(real_sample)
    def spy(self, input_ids, **kwargs):
        widths.append(input_ids.shape[1])
        return real_sample(self, input_ids, **kwargs)

    cases = [(prompt(64, seed=5), 10), (prompt(10, seed=6), 10)]
    dirs = self_drafted(tiny_model_dirs)
    expected = [library_alone(dirs, ids, new, n_positions=256).tokens for ids, new in cases]
    monkeypatch.setattr(speculation.SpeculativeGenerator, "sample", spy)
    loop = library_engine(dirs, 2, n_positions=256).row_loop()
    rows = [loop.join(request(ids, new)) for ids, new in cases]
    loop.step()
    assert [row.seq.generated() for row in rows] == expected and widths == [64]


def test_models_without_right_padding_are_refused(neuronx: ModuleType, tiny_model_dirs: dict[str, Path]) -> None:
    config = neuron_config(
        tiny_model_dirs["target"],
        tiny_model_dirs["draft"],
        speculation={"engine": "library"},
        target={"batch_size": 2},
        draft={"batch_size": 2},
    )
    target = NeuronBackend(
        batched_model(tiny_model_dirs["target"], 2, K, padding_side="left"), "target", VOCAB, N_POSITIONS, K
    )
    draft = NeuronBackend(
        batched_model(tiny_model_dirs["draft"], 2, padding_side="left"), "draft", VOCAB, N_POSITIONS, None
    )
    with pytest.raises(RuntimeProblem, match="padding_side='right'"):
        LibraryEngine.from_config(config, target, draft, GreedyAcceptor())


def test_the_older_generation_runs_its_loop_at_batch_1_only(
    neuronx_any: ModuleType, tiny_model_dirs: dict[str, Path]
) -> None:
    """0.10-0.12 raise for batch > 1 (speculation.py:346-347): the loader refuses the batch before any model is
    built, by the batch rules keyed by what the build does. On 0.13 only a draft compiled for another batch is."""
    two = neuron_config(
        tiny_model_dirs["target"],
        tiny_model_dirs["draft"],
        speculation={"engine": "library"},
        target={"batch_size": 2},
        draft={"batch_size": 1},
    )
    with pytest.raises(UsageError) as caught:
        load_neuron_backends(two, plan_deployment(two))
    problems = {p.field: p for p in caught.value.problems}
    assert set(problems) == ({"draft.batch_size"} if neuronx_any.API == "sdk_2_21" else {"target.batch_size"})
    assert neuronx_any.RUNTIME.calls() == []
    if neuronx_any.API == "sdk_2_18":
        rule, fix = problems["target.batch_size"].rule, problems["target.batch_size"].fix
        assert "speculation.py:346-347" in rule and "0.10.0.21" in rule
        assert "target.batch_size: 1" in fix and "0.13" in fix
        one = neuron_config(tiny_model_dirs["target"], tiny_model_dirs["draft"], speculation={"engine": "library"})
        target, draft = load_neuron_backends(one, plan_deployment(one))
        from transformers_neuronx.speculation import SpeculativeGenerator

        with pytest.raises(NotImplementedError):  # what the stand-in of 0.10 does with a batch, as the real one
            SpeculativeGenerator(draft.model, target.model, K).sample(torch.ones(2, 3, dtype=torch.long), 8)


def test_the_librarys_default_acceptor_mixes_rows_up_at_batch_2(neuronx: ModuleType) -> None:
    """The stand-in's port of DefaultTokenAcceptor (speculation.py:231-283 at 1ade6d7): row 1 alone accepts the
    drafts its target is sure of; beside row 0 its draft ids are read through (1, k-1, bs) (:247) from row 0's
    probabilities (:248-249), so it is cut short. Why our engines call every acceptor one row at a time."""
    from transformers_neuronx.speculation import DefaultTokenAcceptor

    def row(first: int, last: int, sure: float) -> torch.Tensor:
        logits = torch.zeros(1, 3, VOCAB)
        logits[0, :2, first] = logits[0, 2, last] = sure
        return logits

    draft_ids = torch.tensor([[5, 5], [7, 7]])  # row 0's target disagrees with its draft, row 1's agrees
    drafts, targets = torch.cat([row(5, 5, 12.0), row(7, 9, 12.0)]), torch.cat([row(6, 6, 12.0), row(7, 9, 11.0)])
    torch.manual_seed(0)
    alone = DefaultTokenAcceptor()(draft_ids[1:], drafts[1:, :2], targets[1:])
    assert alone.tolist() == [[7, 7, 9]]
    torch.manual_seed(0)
    batched = DefaultTokenAcceptor()(draft_ids, drafts[:, :2], targets)
    assert batched[1].tolist()[0] != 7  # rejected at once: row 0's target gives token 5 (index [0, 0, 1]) no mass


def test_a_plugged_acceptor_delegating_to_the_librarys_default_sees_one_row_at_a_time(
    neuronx: ModuleType, tiny_model_dirs: dict[str, Path]
) -> None:
    """At batch 3 `engine: library` hands each row's window to the row's acceptor alone, so an acceptor that
    delegates to DefaultTokenAcceptor never meets its batch > 1 mix-up (speculation.py:247-249)."""
    from transformers_neuronx.speculation import DefaultTokenAcceptor

    shapes: list[tuple[tuple[int, ...], ...]] = []

    class Delegating:
        def __call__(self, draft_ids, draft_scores, target_scores):
            shapes.append((tuple(draft_ids.shape), tuple(draft_scores.shape), tuple(target_scores.shape)))
            return DefaultTokenAcceptor()(draft_ids, draft_scores, target_scores)

    loop = library_engine(self_drafted(tiny_model_dirs), 3).row_loop()
    rows = [loop.join(request(ids, new, acceptor=ZeroPaddedAcceptor(Delegating()))) for ids, new in CASES]
    loop.step()
    assert all(row.finished for row in rows)
    assert shapes and {s[0][0] for s in shapes} == {1} == {s[2][0] for s in shapes}
    assert {s[2][1] for s in shapes} == {K}
