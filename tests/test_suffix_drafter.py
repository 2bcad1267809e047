"""Suffix drafter: tree counts against brute force, known drafts, eviction, persistence, greedy equality."""

from __future__ import annotations

import json
import logging
import random
from collections import Counter

import pytest
import torch
from conftest import backend, tiny_llama

from neuron_ssp.config import SamplingConfig, SuffixConfig, config_from_dict
from neuron_ssp.drafters import NgramDrafter, SuffixDrafter, SuffixHistory
from neuron_ssp.drafters.ngram import lookup_match
from neuron_ssp.drafters.suffix_store import HistoryFile
from neuron_ssp.drafters.suffix_tree import SuffixTree
from neuron_ssp.engines.base import sampling_params
from neuron_ssp.engines.native import SpeculativeGenerator, plain_generate
from neuron_ssp.errors import UsageError
from neuron_ssp.speculation.acceptors import build_acceptor
from neuron_ssp.speculation.policies import FixedPolicy, TargetConfidencePolicy

GREEDY = SamplingConfig(temperature=0.0)
VOCAB = 64


def loose(**settings) -> SuffixConfig:
    """Settings that draft on any match (the defaults want 2 tokens of context, 5 from the history)."""
    return SuffixConfig(**{"min_match": 1, "min_history_match": 1, "min_token_prob": 0.1, **settings})


def brute_counts(sequences: list[list[int]], context: list[int], depth: int) -> Counter:
    """How often each token followed `context`, over occurrences cut at `depth` + 1 tokens (the tree's rule)."""
    n = len(context)
    counts: Counter = Counter()
    for seq in sequences:
        for start in range(len(seq) - n):
            if n + 1 <= depth + 1 and seq[start : start + n] == context:
                counts[seq[start + n]] += 1
    return counts


def all_contexts(sequences: list[list[int]], depth: int) -> set[tuple[int, ...]]:
    return {tuple(seq[i : i + n]) for seq in sequences for n in range(1, depth + 1) for i in range(len(seq) - n + 1)}


def assert_tree_matches(tree: SuffixTree, sequences: list[list[int]]) -> None:
    for context in all_contexts(sequences, tree.max_depth):
        assert tree.continuations(context) == dict(brute_counts(sequences, list(context), tree.max_depth)), context


def random_sequences(seed: int, count: int, vocab: int = 4) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randrange(1, 30))] for _ in range(count)]


@pytest.mark.parametrize("seed", range(6))
def test_tree_counts_equal_brute_force(seed):
    sequences = random_sequences(seed, 5)
    tree = SuffixTree(max_depth=4)
    for seq in sequences:
        tree.add(seq)
    assert_tree_matches(tree, sequences)


@pytest.mark.parametrize("seed", range(4))
def test_growing_sequence_equals_one_built_at_once(seed):
    """The request's own tree grows token by token (and in bursts) and must count as if built whole."""
    rng = random.Random(seed)
    sequences = random_sequences(seed, 3, vocab=3)
    tree = SuffixTree(max_depth=5)
    for seq in sequences[:-1]:
        tree.add(seq)
    sid = tree.open()
    last, i = sequences[-1], 0
    while i < len(last):
        step = rng.randrange(1, 4)
        tree.extend(sid, last[i : i + step])
        i += step
    assert_tree_matches(tree, sequences)


@pytest.mark.parametrize("seed", range(4))
def test_removing_sequences_leaves_the_tree_of_the_rest(seed):
    sequences = random_sequences(seed, 6)
    tree = SuffixTree(max_depth=4)
    ids = [tree.add(seq) for seq in sequences]
    for sid in ids[:4]:
        tree.remove(sid)
    assert_tree_matches(tree, sequences[4:])
    for sid in ids[4:]:
        tree.remove(sid)
    assert tree.node_count() == (1, 0) and tree.stored_tokens == 0 and tree.root.count == 0


def test_known_counts_give_the_most_frequent_continuation():
    """History: 'A B C D' three times, 'A B X Y' once -> after 'A B' the draft is 'C D', P(C) = 3/4."""
    a, b, c, d, x, y = 10, 11, 12, 13, 14, 15
    history = SuffixHistory(loose(max_depth=8, min_token_prob=0.1, max_spec_factor=4.0))
    for seq in ([a, b, c, d], [a, b, x, y], [a, b, c, d], [a, b, c, d]):
        history.add(seq)
    path = history.speculate([1, 2, a, b], 4)
    assert path.tokens == [c, d] and path.match_len == 2
    assert path.probs == pytest.approx([0.75, 0.75])
    assert history.tree.continuations([a, b]) == {c: 3, x: 1}
    # min_token_prob above 3/4: nothing is likely enough to draft
    strict = SuffixHistory(loose(max_depth=8, min_token_prob=0.8, max_spec_factor=4.0))
    for seq in ([a, b, c, d], [a, b, x, y], [a, b, c, d], [a, b, c, d]):
        strict.add(seq)
    assert strict.speculate([a, b], 4).tokens == []


def test_longest_match_beats_a_more_frequent_short_one():
    history = SuffixHistory(loose(max_depth=8, max_spec_factor=4.0))
    for seq in ([5, 1, 2], [5, 1, 2], [6, 1, 3]):
        history.add(seq)
    assert history.speculate([6, 1], 1).tokens == [3]  # '6 1' seen once, followed by 3
    assert history.speculate([7, 1], 1).tokens == [2]  # only '1' matches: 2 follows it twice out of three


def test_draft_length_is_capped_by_the_spec_factor():
    history = SuffixHistory(loose(max_depth=8, max_spec_factor=1.0))
    history.add(list(range(20)))
    assert history.speculate([30, 3, 4], 10).tokens == [5, 6]  # match 2 -> at most 2 tokens
    assert len(history.speculate([1, 2, 3, 4], 10).tokens) == 4


def test_local_and_global_sources_are_scored_together():
    """The higher expected accepted length wins: a certain continuation beats an uncertain one."""
    settings = loose(max_depth=8, max_spec_factor=4.0, min_token_prob=0.1)
    drafter = SuffixDrafter(VOCAB, settings)
    drafter.history.add([1, 2, 3, 4, 5, 6, 7, 8])
    propose = lambda seq: drafter.propose(torch.tensor(seq), 4)  # noqa: E731
    drafter.begin(torch.tensor([9, 30, 31]), 16)  # nothing in the request itself matches
    assert propose([9, 30, 31, 1, 2]).tokens.tolist() == [3, 4, 5, 6]
    drafter.begin(torch.tensor([1, 2, 50, 1, 2, 51, 9]), 16)  # the request saw '1 2' go two ways: p = 1/2 each
    assert propose([1, 2, 50, 1, 2, 51, 9, 1, 2]).tokens.tolist() == [3, 4, 5, 6]  # global is certain
    drafter.history.clear()
    drafter.history.add([1, 2, 3, 0])
    drafter.history.add([1, 2, 4, 0])
    drafter.history.add([1, 2, 5, 0])  # global: '1 2' goes three ways, p = 1/3
    drafter.begin(torch.tensor([8, 1, 2, 60, 61, 62, 8]), 16)
    assert propose([8, 1, 2, 60, 61, 62, 8, 1, 2]).tokens.tolist() == [60, 61, 62, 8]  # the request's own text


def test_finish_adds_the_request_to_the_history():
    drafter = SuffixDrafter(VOCAB, loose(max_depth=8, max_spec_factor=4.0))
    drafter.begin(torch.tensor([1, 2, 3]), 16)
    drafter.finish(torch.tensor([1, 2, 3, 20, 21, 22, 23]))
    assert drafter.history.stored_tokens == 7
    drafter.begin(torch.tensor([5, 3]), 16)
    out = drafter.propose(torch.tensor([5, 3]), 3)
    assert out.tokens.tolist() == [20, 21, 22]


def test_eviction_keeps_the_history_under_cache_tokens():
    history = SuffixHistory(loose(max_depth=6, cache_tokens=100))
    rng = random.Random(0)
    requests = [[rng.randrange(VOCAB) for _ in range(rng.randrange(10, 40))] for _ in range(30)]
    for tokens in requests:
        history.add(tokens)
        assert history.stored_tokens <= 100
    kept = history.tree.sequences()
    assert kept == requests[len(requests) - len(kept) :]  # the newest requests, oldest evicted first
    nodes, leaves = history.tree.node_count()
    assert leaves <= 100 and nodes <= 100 * 7  # memory follows the stored tokens, not everything seen
    fresh = SuffixTree(6)
    for tokens in kept:
        fresh.add(tokens)
    assert history.tree.node_count() == fresh.node_count()  # evicted requests leave no nodes behind
    assert_tree_matches(history.tree, kept)
    history.add(list(range(150)))  # longer than the bound: its last 100 tokens are kept
    assert history.tree.sequences() == [list(range(50, 150))]


def test_persist_and_load_round_trip(tmp_path):
    path = tmp_path / "history.jsonl"
    settings = loose(max_depth=8, max_spec_factor=4.0, persist_path=str(path))
    first = SuffixHistory(settings, HistoryFile(path, "m", VOCAB))
    first.add([1, 2, 3, 4])
    first.add([7, 2, 3, 9])
    again = SuffixHistory(settings, HistoryFile(path, "m", VOCAB))
    assert again.tree.sequences() == [[1, 2, 3, 4], [7, 2, 3, 9]] and again.load_problem is None
    assert again.speculate([1, 2, 3], 1).tokens == [4]


def test_load_evicts_to_cache_tokens_and_compacts_the_file(tmp_path):
    path = tmp_path / "history.jsonl"
    big = SuffixHistory(loose(cache_tokens=1000), HistoryFile(path, "m", VOCAB))
    for i in range(5):
        big.add([i] * 10)
    small = SuffixHistory(loose(cache_tokens=25), HistoryFile(path, "m", VOCAB))
    assert small.tree.sequences() == [[3] * 10, [4] * 10]
    assert len(path.read_text().splitlines()) == 3  # header + the two kept requests


@pytest.mark.parametrize(
    "content, says",
    [
        ("not json\n[1, 2]\n", "line 1"),
        ('{"format": "neuron-ssp suffix history", "version": 1, "model": "m", "vocab_size": 64}\n[1, 2\n', "line 2"),
        ('{"format": "neuron-ssp suffix history", "version": 1, "model": "m", "vocab_size": 64}\n[1, 999]\n', "line 2"),
        ('{"format": "neuron-ssp suffix history", "version": 1, "model": "other", "vocab_size": 64}\n', "other"),
        ("\x00\xff garbage", "line 1"),
    ],
)
def test_a_corrupt_file_gives_a_clear_error_and_an_empty_start(tmp_path, caplog, content, says):
    path = tmp_path / "history.jsonl"
    path.write_text(content, errors="surrogateescape") if "\x00" not in content else path.write_bytes(b"\x00\xff")
    settings = loose(persist_path=str(path))
    with caplog.at_level(logging.WARNING):
        history = SuffixHistory(settings, HistoryFile(path, "m", VOCAB))
    assert history.stored_tokens == 0 and history.load_problem is not None
    problem = str(history.load_problem)
    assert "speculation.suffix.persist_path" in problem and "empty history" in problem and "renamed" in problem
    assert says in problem or "cannot be read" in problem
    assert caplog.records and (tmp_path / "history.jsonl.corrupt").exists()
    history.add([1, 2, 3])  # a fresh file is started, and it loads back
    assert SuffixHistory(settings, HistoryFile(path, "m", VOCAB)).tree.sequences() == [[1, 2, 3]]
    assert json.loads(path.read_text().splitlines()[0])["model"] == "m"


def test_long_single_token_run_drafts_the_full_window():
    run = torch.tensor([3] + [1] * 40)
    assert lookup_match(run, 7, ngram_max=3, ngram_min=2)[0].tolist() == [1] * 7
    assert NgramDrafter(VOCAB).propose(run, 7).tokens.tolist() == [1] * 7
    drafter = SuffixDrafter(VOCAB, SuffixConfig())
    drafter.begin(run[:5], 16)
    assert drafter.propose(run, 7).tokens.tolist() == [1] * 7
    periodic = torch.tensor([9, 4, 5, 6, 4, 5, 6, 4, 5])  # a short period repeats too
    assert lookup_match(periodic, 5, 3, 2)[0].tolist() == [6, 4, 5, 6, 4]


def test_config_block_and_errors():
    config = config_from_dict({"speculation": {"drafter": "suffix", "suffix": {"max_depth": 16}}})
    assert config.speculation.suffix.max_depth == 16 and config.speculation.suffix.cache_tokens > 0
    with pytest.raises(UsageError) as err:
        config_from_dict({"speculation": {"suffix": {"max_dept": 3, "min_token_prob": 2}}})
    text = str(err.value)
    assert "speculation.suffix.max_dept" in text and "did you mean 'max_depth'" in text
    assert "speculation.suffix.min_token_prob" in text


def make(target, drafter, k, policy=None):
    rng = torch.Generator()
    return SpeculativeGenerator(
        target,
        drafter,
        build_acceptor("greedy", sampling_params(GREEDY), rng),
        policy or FixedPolicy(k),
        GREEDY,
        k,
        rng,
    )


@pytest.mark.parametrize("k", [2, 5, 8])
@pytest.mark.parametrize("seed", [0, 3])
def test_greedy_ssp_with_suffix_equals_plain_on_tiny_llamas(k, seed):
    """Two requests through one drafter: the second drafts from the first's history too."""
    target = tiny_llama(seed)
    drafter = SuffixDrafter(target.config.vocab_size, loose(max_depth=8, max_spec_factor=4.0))
    generator = make(backend(target), drafter, k)
    prompts = [torch.tensor([1, 5, 7, 9, 5, 7, 11, 13, 5, 7]), torch.tensor([2, 5, 7, 9, 5, 7])]
    for prompt in prompts + prompts:
        plain = plain_generate(backend(target), prompt, 40, GREEDY)
        result = generator.generate(prompt, 40)
        assert result.tokens == plain.tokens
    assert drafter.history.stored_tokens > 0 and result.stats.draft_tokens > 0


def test_target_confidence_policy_with_suffix_keeps_greedy_output():
    target = tiny_llama(1)
    drafter = SuffixDrafter(target.config.vocab_size, SuffixConfig())
    prompt = torch.tensor([3, 4, 5, 3, 4, 5, 3, 4])
    plain = plain_generate(backend(target), prompt, 30, GREEDY)
    assert make(backend(target), drafter, 6, TargetConfidencePolicy(6, 0.2)).generate(prompt, 30).tokens == plain.tokens


@pytest.mark.slow
def test_greedy_ssp_with_suffix_equals_plain_on_the_embedded_model(use_embedded_cache):
    from neuron_ssp.config import load_config
    from neuron_ssp.pipeline.load import load_pipeline

    pipeline = load_pipeline(
        load_config(
            overrides={"speculation.drafter": "suffix", "generation.max_new_tokens": 48, "sampling.temperature": 0.0}
        )
    )
    prompts = [
        "Summarize: The Eiffel Tower is a wrought-iron lattice tower in Paris. It is named after the "
        "engineer Gustave Eiffel, whose company designed and built it from 1887 to 1889.",
        "Count from 1 to 30, separated by commas.",
    ]
    for prompt in prompts + prompts:  # the second round drafts from the first round's history
        assert pipeline.speculative(prompt).tokens == pipeline.plain(prompt).tokens
    assert pipeline.generator.drafter.history.stored_tokens > 0


def test_history_updates_never_race_a_draft():
    """A server finishes requests on one thread while another drafts: every draft sees a whole tree."""
    import threading

    history = SuffixHistory(loose(max_depth=6, cache_tokens=400, max_spec_factor=4.0))
    rng = random.Random(1)
    requests = [[rng.randrange(5) for _ in range(rng.randrange(5, 40))] for _ in range(150)]
    errors: list[BaseException] = []

    def finish_requests() -> None:
        try:
            for tokens in requests:
                history.add(tokens)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    writer = threading.Thread(target=finish_requests)
    writer.start()
    drafts = 0
    while writer.is_alive() or drafts < 200:
        path = history.speculate([rng.randrange(5) for _ in range(6)], 7)
        assert len(path.tokens) <= 7 and all(0 <= p <= 1 for p in path.probs)
        drafts += 1
    writer.join()
    assert not errors
    assert_tree_matches(history.tree, history.tree.sequences())


def test_min_match_keeps_short_contexts_from_drafting():
    history = SuffixHistory(loose(max_depth=8, max_spec_factor=4.0, min_match=2))
    history.add([5, 1, 2, 3])
    assert history.speculate([9, 1], 3).tokens == []  # one matching token is not enough
    assert history.speculate([5, 1], 3).tokens == [2, 3]


@pytest.mark.parametrize("seed", range(4))
def test_a_prefer_recent_tree_drafts_what_followed_the_latest_occurrence(seed):
    """The request's own tree: prompt lookup's rule, checked against a brute-force scan for the latest match."""
    rng = random.Random(seed)
    tree = SuffixTree(max_depth=4, prefer_recent=True)
    sid = tree.open()
    seq: list[int] = []
    for _ in range(60):
        step = [rng.randrange(3) for _ in range(rng.randrange(1, 4))]
        tree.extend(sid, step)
        seq += step
        for n in range(1, 4):
            context = seq[-n:]
            path = tree.speculate(context, 1, max_spec_factor=4.0, min_token_prob=0.0)
            assert (path.match_len, path.tokens) == latest_continuation(seq, context), (seq, context)


def latest_continuation(seq: list[int], context: list[int]) -> tuple[int, list[int]]:
    """Brute force: the longest suffix of `context` seen earlier in `seq` with a token after it, and the token that
    followed its latest occurrence; (0, []) where not even its last token was."""
    for m in range(len(context), 0, -1):
        starts = [i for i in range(len(seq) - m) if seq[i : i + m] == context[-m:]]
        if starts:
            return m, [seq[starts[-1] + m]]
    return 0, []


def test_the_request_drafts_its_latest_continuation_and_the_history_its_most_frequent():
    a, b, c, x = 10, 11, 12, 14
    text = [a, b, c, 1, a, b, c, 2, a, b, x, 3]  # 'a b' went to c twice, then to x
    history = SuffixHistory(loose(max_depth=8))
    history.add(text)
    assert history.speculate([9, a, b], 1).tokens == [c]  # most frequent across requests
    drafter = SuffixDrafter(VOCAB, loose(max_depth=8), SuffixHistory(loose(max_depth=8)))
    drafter.begin(torch.tensor(text), 8)
    assert drafter.propose(torch.tensor([*text, 9, a, b]), 1).tokens.tolist() == [x]  # latest in the request


def test_the_history_drafts_only_after_min_history_match_tokens():
    drafter = SuffixDrafter(VOCAB, SuffixConfig(min_match=2, min_history_match=4, min_token_prob=0.1))
    drafter.history.add([1, 2, 3, 4, 5, 6, 7, 8])
    drafter.begin(torch.tensor([40, 41]), 8)
    assert len(drafter.propose(torch.tensor([40, 41, 3, 4]), 4)) == 0  # 2 tokens match: too short for history
    drafter.begin(torch.tensor([40, 41]), 8)
    assert drafter.propose(torch.tensor([40, 41, 1, 2, 3, 4]), 4).tokens.tolist() == [5, 6, 7, 8]
    drafter.begin(torch.tensor([3, 4, 30, 31, 32]), 8)  # the request's own text needs only min_match = 2
    assert drafter.propose(torch.tensor([3, 4, 30, 31, 32, 3, 4]), 3).tokens.tolist() == [30, 31, 32]
