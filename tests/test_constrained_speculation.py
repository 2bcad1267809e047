"""Exact constrained speculation: each window position is masked with the grammar state after the drafts before it,
so constrained speculation returns constrained plain decoding's tokens (greedy; sampled with the same seed) and
draws from its distribution (chi-square at every position, rejection sampling with a sampled draft model). The
grammar is checked against an oracle written without llguidance (grammar_support.py); a broken mask (TGI's: every
position from the un-advanced state) must fail the same checks; the rollback paths run: drafts rejected, forced
tokens rejected, EOS inside a window.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch
from conftest import TableBackend, backend, tiny_llama
from grammar_support import EOS, LANGUAGE, REGEX, SCHEMA, TEXT, VOCAB, compiler, exact_outputs, oracle_allowed
from lossless_support import chi_square_p_value
from test_batching import SlotTables
from test_lossless import OwnRandomnessAcceptor

from neuron_ssp.backends.base import SlotView
from neuron_ssp.drafters import Draft, ModelDrafter, NgramDrafter
from neuron_ssp.drafters.base import point_masses
from neuron_ssp.engines.continuous_batch import ContinuousBatchLoop
from neuron_ssp.engines.rows import RowRequest, RowSettings
from neuron_ssp.speculation.acceptors import ProbabilisticAcceptor
from neuron_ssp.speculation.controls import Grammar, RequestControls
from neuron_ssp.speculation.grammar import GrammarMatcher
from neuron_ssp.speculation.policies import FixedPolicy
from neuron_ssp.speculation.processors import RowProcessor
from neuron_ssp.speculation.sampling import SamplingParams

K = 4
GREEDY, HOT = SamplingParams(), SamplingParams(temperature=1.0)
PROMPT = torch.tensor([2, 0, 1])
COMPILER = compiler()


class JunkDrafter:
    """Point masses chosen by a generator from the whole vocabulary: most are invalid under the grammar (the cut),
    some are EOS (EOS inside a window), most valid ones are rejected (rollback)."""

    def __init__(self, seed: int = 0):
        self.generator = torch.Generator().manual_seed(seed)

    def begin(self, prompt_ids, max_new_tokens, noise=None) -> None: ...

    def propose(self, sequence: torch.Tensor, max_tokens: int) -> Draft:
        tokens = torch.randint(0, VOCAB, (max_tokens,), generator=self.generator)
        return Draft(tokens, point_masses(tokens, VOCAB), deterministic=True)

    def finish(self, sequence) -> None: ...


class UnadvancedMatcher(GrammarMatcher):
    """TGI's mask: every window position masked from the committed state, not the state after the drafts before it."""

    def allowed_along(self, path: list[int], rows: int) -> torch.Tensor:
        return super().allowed_along([], 1).expand(rows, -1).clone()

    def valid_prefix(self, path: list[int]) -> int:
        return len(path)


def processors(grammar: Grammar | None = REGEX, matcher_cls: type[GrammarMatcher] = GrammarMatcher, **controls):
    asked = RequestControls(grammar=grammar, **controls)

    def make(prompt: torch.Tensor) -> RowProcessor:
        matcher = None
        if grammar is not None:
            matcher = matcher_cls(COMPILER.matcher(grammar)._matcher, VOCAB, {EOS})
        return RowProcessor(asked, VOCAB, prompt, {EOS}, {EOS}, matcher)

    return make


def settings(params: SamplingParams, seed: int, drafter_for=None, acceptor=None, processor_for=None, forced=True):
    return RowSettings(
        params,
        seed,
        drafter_for,
        acceptor or ProbabilisticAcceptor(params, torch.Generator().manual_seed(seed)),
        FixedPolicy(K) if drafter_for is not None else None,
        torch.Generator().manual_seed(seed),
        processor_for,
        forced,
    )


def generate(target, row_settings: RowSettings, new: int = 12, prompt: torch.Tensor = PROMPT) -> list[int]:
    return ContinuousBatchLoop(target, K).run(RowRequest(prompt, new, {EOS}, row_settings)).tokens


def text_of(tokens: list[int]) -> str:
    return "".join(TEXT[token] for token in tokens if token != EOS)


def test_masks_along_a_path_are_the_states_after_the_tokens_before_each_position():
    matcher = COMPILER.matcher(REGEX)
    for string in LANGUAGE:
        path = [TEXT.index(char) for char in string] + [EOS]
        masks = matcher.allowed_along(path, len(path) + 1)
        for j in range(len(path)):
            assert torch.equal(masks[j], oracle_allowed(string[:j])), (string, j)
        assert matcher.valid_prefix(path) == len(path)
    assert matcher.valid_prefix([TEXT.index("c"), TEXT.index("c"), TEXT.index("c")]) == 2
    assert matcher.forced() == []  # the committed state never moved
    assert torch.equal(matcher.allowed([]), oracle_allowed(""))


@pytest.mark.parametrize("grammar", [REGEX, SCHEMA], ids=["regex", "json_schema"])
@pytest.mark.parametrize("drafter", ["ngram", "junk", "model"])
def test_greedy_constrained_ssp_equals_constrained_plain_greedy(grammar, drafter):
    target = backend(tiny_llama(0, vocab_size=VOCAB))
    draft_model = backend(tiny_llama(1, vocab_size=VOCAB, layers=1))
    drafters = {
        "ngram": lambda slot: NgramDrafter(VOCAB),
        "junk": lambda slot: JunkDrafter(),
        "model": lambda slot: ModelDrafter(draft_model, GREEDY, None),
    }
    for prompt in (PROMPT, torch.tensor([5, 6, 7, 8]), torch.tensor([13, 10])):
        plain = generate(target, settings(GREEDY, 0, processor_for=processors(grammar)), 20, prompt)
        ssp = generate(target, settings(GREEDY, 0, drafters[drafter], processor_for=processors(grammar)), 20, prompt)
        assert ssp == plain
        if grammar is REGEX and plain[-1] == EOS:
            assert text_of(plain) in LANGUAGE
        if grammar is SCHEMA and plain[-1] == EOS:
            assert set(json.loads(text_of(plain))) == {"ab"}


def seeded_outputs(target, drafter_for, matcher_cls=GrammarMatcher, seeds=range(60), acceptor_cls=None):
    """(plain, speculative) outputs per seed, both constrained by REGEX."""
    pairs = []
    for seed in seeds:
        make = processors(REGEX, matcher_cls)
        acceptor = acceptor_cls(HOT, torch.Generator().manual_seed(seed)) if acceptor_cls else None
        plain = generate(target, settings(HOT, seed, processor_for=processors(REGEX)), 6)
        pairs.append((plain, generate(target, settings(HOT, seed, drafter_for, acceptor, make), 6)))
    return pairs


def test_seeded_constrained_ssp_returns_constrained_plain_samplings_tokens():
    target = TableBackend(VOCAB, 0)
    draft = target.perturbed(0.8, seed=1)
    for drafter_for in (lambda slot: JunkDrafter(), lambda slot: ModelDrafter(draft, HOT, None)):
        for plain, ssp in seeded_outputs(target, drafter_for):
            assert ssp == plain
            assert text_of(plain) in LANGUAGE or plain[-1] != EOS


def test_a_mask_from_the_unadvanced_state_is_caught():
    """With every position masked from the committed state, a drafted token can be followed by a token the grammar
    forbids after it: the committed state refuses it (the row fails loudly) or the text differs from constrained
    plain sampling's. The same check passes with the masks along the path (the test above)."""
    target = TableBackend(VOCAB, 0)
    caught = 0
    for seed in range(60):
        plain = generate(target, settings(HOT, seed, processor_for=processors(REGEX)), 6)
        try:
            ssp = generate(
                target, settings(HOT, seed, lambda slot: JunkDrafter(), None, processors(REGEX, UnadvancedMatcher)), 6
            )
        except RuntimeError as refused:
            assert "is not allowed here" in str(refused)
            caught += 1
        else:
            caught += ssp != plain
    assert caught > 5


def oracle_ok(tokens: list[int]) -> bool:
    text = ""
    for token in tokens:
        if not oracle_allowed(text)[token]:
            return False
        text += TEXT[token] if token != EOS else ""
    return True


SAMPLES = 2500
ALPHA = 1e-3


def test_constrained_ssp_with_a_sampled_draft_follows_constrained_plain_sampling_at_every_position():
    """Rejection sampling with its own randomness (not the per-position noise), a draft model drafting under the
    mask: the outputs' distribution, and each position's marginal, are constrained plain sampling's."""
    target = TableBackend(VOCAB, 0)
    draft = target.perturbed(0.8, seed=1)
    new = 5
    exact = dict(exact_outputs(target.table, PROMPT, new))
    assert abs(sum(exact.values()) - 1) < 1e-9
    outputs = [
        tuple(ssp)
        for _, ssp in seeded_outputs(
            target, lambda slot: ModelDrafter(draft, HOT, None), seeds=range(SAMPLES), acceptor_cls=OwnRandomness
        )
    ]
    assert all(oracle_ok(list(output)) for output in outputs)
    keys = sorted(exact)
    observed = Counter(outputs)
    assert set(observed) <= set(exact)
    p_values = {
        "outputs": chi_square_p_value(
            torch.tensor([observed[key] for key in keys], dtype=torch.float64),
            torch.tensor([exact[key] for key in keys], dtype=torch.float64),
        )
    }
    for position in range(new):
        cells = sorted({key[position] if len(key) > position else -1 for key in keys})
        expected = torch.tensor(
            [
                sum(p for key, p in exact.items() if (key[position] if len(key) > position else -1) == cell)
                for cell in cells
            ],
            dtype=torch.float64,
        )
        seen = torch.tensor(
            [sum(1 for o in outputs if (o[position] if len(o) > position else -1) == cell) for cell in cells],
            dtype=torch.float64,
        )
        p_values[f"token {position + 1}"] = chi_square_p_value(seen, expected)
    failing = {name: p for name, p in p_values.items() if p <= ALPHA / len(p_values)}
    assert not failing, failing


class OwnRandomness(OwnRandomnessAcceptor):
    pass


CONTROLS = {
    "logit_bias": {"logit_bias": ((0, 2.0), (EOS, -1.5))},
    "min_tokens": {"min_tokens": 4},
    "repetition_penalty": {"repetition_penalty": 1.6},
    "presence_penalty": {"presence_penalty": 1.2},
    "frequency_penalty": {"frequency_penalty": 0.9},
    "all": {"logit_bias": ((1, 1.0),), "min_tokens": 2, "repetition_penalty": 1.3, "frequency_penalty": 0.5},
}


@pytest.mark.parametrize("name", list(CONTROLS))
def test_greedy_ssp_equals_plain_with_each_sampling_control(name):
    target = TableBackend(VOCAB, 0)
    draft = target.perturbed(0.8, seed=1)
    for grammar in (None, REGEX):
        make = processors(grammar, **CONTROLS[name])
        plain = generate(target, settings(GREEDY, 0, processor_for=make), 16)
        for drafter_for in (lambda slot: JunkDrafter(), lambda slot: ModelDrafter(draft, GREEDY, None)):
            assert generate(target, settings(GREEDY, 0, drafter_for, processor_for=make), 16) == plain, grammar
        without = generate(target, settings(GREEDY, 0), 16)
        assert plain != without or grammar is None and name == "min_tokens"  # each control changes this output


def test_min_tokens_masks_the_stop_ids_until_enough_tokens_came():
    target = TableBackend(VOCAB, 0)
    biased = processors(None, logit_bias=((EOS, 50.0),), min_tokens=3)
    assert generate(target, settings(GREEDY, 0, lambda slot: JunkDrafter(), processor_for=biased), 10)[3:] == [EOS]


def penalised_exact(table: torch.Tensor, controls: dict, new: int) -> dict[tuple[int, ...], float]:
    vocab = table.shape[0]
    """Plain sampling at temperature 1 with the penalties, written out without the processor: every output's
    probability."""
    rep, freq, pres = controls.get("repetition_penalty", 1.0), controls.get("frequency_penalty", 0.0), 0.0
    found: dict[tuple[int, ...], float] = {}

    def walk(tokens: tuple[int, ...], probability: float) -> None:
        if len(tokens) == new:
            found[tokens] = probability
            return
        context = PROMPT.tolist() + list(tokens)
        logits = table[context[-2], context[-1]].double().clone()
        counts = torch.bincount(torch.tensor(tokens, dtype=torch.long), minlength=vocab).double()
        seen = counts > 0
        seen[PROMPT] = True
        logits = torch.where(seen, torch.where(logits > 0, logits / rep, logits * rep), logits)
        logits = logits - freq * counts - pres * (counts > 0).double()
        for token, p in enumerate(logits.softmax(-1).tolist()):
            walk(tokens + (token,), probability * p)

    walk((), 1.0)
    return found


def test_penalised_ssp_with_a_sampled_draft_follows_penalised_plain_sampling():
    """Rejection sampling with its own randomness and a draft model drafting under the penalties: the distribution
    of three-token outputs (every position jointly) is the penalised target's, computed without the processor."""
    small = 6
    target = TableBackend(small, 0)
    draft = target.perturbed(0.8, seed=1)
    controls = {"repetition_penalty": 1.8, "frequency_penalty": 1.0}
    prompt = torch.tensor([2, 0, 1])
    exact = penalised_exact(target.table, controls, 3)
    asked = RequestControls(**controls)
    outputs = Counter()
    for seed in range(SAMPLES):
        row = settings(
            HOT,
            seed,
            lambda slot: ModelDrafter(draft, HOT, None),
            OwnRandomness(HOT, torch.Generator().manual_seed(seed)),
            lambda prompt_ids: RowProcessor(asked, small, prompt_ids, set(), set()),
        )
        outputs[tuple(ContinuousBatchLoop(target, K).run(RowRequest(prompt, 3, (), row)).tokens)] += 1
    keys = sorted(exact)
    observed = torch.tensor([outputs[key] for key in keys], dtype=torch.float64)
    p = chi_square_p_value(observed, torch.tensor([exact[key] for key in keys], dtype=torch.float64))
    assert p > ALPHA, p
    plain_keys = penalised_exact(target.table, {}, 3)
    unpenalised = torch.tensor([plain_keys[key] for key in keys], dtype=torch.float64)
    assert chi_square_p_value(observed, unpenalised) <= ALPHA  # the test sees the penalties


def test_a_row_with_a_grammar_in_a_batch_equals_the_same_row_alone():
    """Rows beside it (with another grammar, with none, with penalties) change nothing of its tokens, greedy or
    seeded; each equals its request alone."""
    target = SlotTables(lambda: TableBackend(VOCAB, 0), 4)
    draft = SlotTables(lambda: TableBackend(VOCAB, 0).perturbed(0.8, seed=1), 4)
    prompts = [PROMPT, torch.tensor([5, 6, 7]), torch.tensor([13, 10]), torch.tensor([1, 1, 2, 0])]
    makes = [processors(REGEX), processors(SCHEMA), None, processors(None, repetition_penalty=1.5)]

    def request(i: int, params: SamplingParams) -> RowRequest:
        drafter_for = lambda slot: ModelDrafter(SlotView(draft, slot), params, None)  # noqa: E731
        return RowRequest(prompts[i], 14, {EOS}, settings(params, 7 + i, drafter_for, processor_for=makes[i]))

    for params in (GREEDY, HOT):
        loop = ContinuousBatchLoop(target, K)
        rows = [loop.join(request(i, params)) for i in range(4)]
        while loop.rows:
            loop.step()
        assert all(row.error is None for row in rows), [row.error for row in rows]
        together = [row.seq.generated() for row in rows]
        alone = [ContinuousBatchLoop(target, K).run(request(i, params)).tokens for i in range(4)]
        assert together == alone
        assert text_of(together[0]) in LANGUAGE or together[0][-1] != EOS


def test_forced_tokens_lead_proposals_whose_other_drafts_are_rejected_and_rolled_back():
    """The schema forces '{"ab": ' token by token (llguidance allows only that tokenization there, so the target
    accepts forced drafts); junk drafts behind them are mostly rejected: the grammar rolls back to the accepted
    tokens, and the output is constrained plain sampling's, with forced drafts or without."""
    target = TableBackend(VOCAB, 0)
    accepted = {True: 0, False: 0}
    for seed in range(20):
        plain = generate(target, settings(HOT, seed, processor_for=processors(SCHEMA)), 10)
        for forced in (True, False):
            junk = JunkDrafter(seed)
            row = settings(HOT, seed, lambda slot, junk=junk: junk, processor_for=processors(SCHEMA), forced=forced)
            result = ContinuousBatchLoop(target, K).run(RowRequest(PROMPT, 10, {EOS}, row))
            assert result.tokens == plain
            accepted[forced] += result.stats.accepted_tokens
    assert accepted[True] >= accepted[False] + 20 * 2  # forced drafts accepted in every request


def test_an_eagle_head_drafts_under_the_mask_and_waits_behind_forced_tokens():
    """An EAGLE-3 head drafts from the target's hidden states, which exist only for scored tokens: behind forced
    tokens it does not draft (its taps wait for the next step); elsewhere it drafts under the row's mask. Greedy and
    seeded outputs equal constrained plain decoding's."""
    from test_eagle_drafter import eagle
    from test_eagle_drafter import target as eagle_target

    from neuron_ssp.drafters.eagle import EagleDrafter

    model_target = eagle_target()
    head = eagle(model_target)
    for grammar in (SCHEMA, REGEX):
        for params, seed in ((GREEDY, 0), (HOT, 3), (HOT, 4)):
            plain = generate(model_target, settings(params, seed, processor_for=processors(grammar)), 16)
            drafter_for = lambda slot, params=params: EagleDrafter(head, slot, params)  # noqa: E731
            ssp = generate(model_target, settings(params, seed, drafter_for, processor_for=processors(grammar)), 16)
            assert ssp == plain, (grammar.kind, params, seed)
