"""Prefix caching across the requests of one loop (engines/slot_caches.py, engines/prefix_pool.py): a request that
starts from a warm slot or from the pool gives, bit for bit, what it gives with every prompt prefilled from position
0 (greedy, seeded, the target's logits), alone and in a batch; eviction never changes an answer; the pool stays within
its budget.

On a tiny Llama through the row kernel, where a row does not depend on the call it is in."""

from __future__ import annotations

import pytest
import torch
from conftest import TINY_VOCAB, tiny_llama
from eagle_support import tiny_head
from test_batched_scoring import needs_kernel

from neuron_ssp.backends.base import SlotView
from neuron_ssp.backends.torch.scoring import TorchBackend
from neuron_ssp.config import SamplingConfig
from neuron_ssp.drafters.eagle import EagleDrafter, EagleModel
from neuron_ssp.drafters.model import ModelDrafter
from neuron_ssp.drafters.ngram import NgramDrafter
from neuron_ssp.engines.base import sampling_params
from neuron_ssp.engines.continuous_batch import ContinuousBatchLoop
from neuron_ssp.engines.prefix_pool import PrefixPool, chain_keys
from neuron_ssp.engines.rows import Row, RowCallbacks, RowRequest, RowSettings
from neuron_ssp.engines.slot_caches import SlotCaches
from neuron_ssp.speculation.acceptors import build_acceptor
from neuron_ssp.speculation.policies import WindowPolicy

pytestmark = needs_kernel
K, POSITIONS, BLOCK = 4, 256, 16
GREEDY = SamplingConfig(temperature=0.0)
SAMPLED = SamplingConfig(temperature=1.0, top_p=0.9, seed=7)
SYSTEM = torch.randint(1, TINY_VOCAB, (40,), generator=torch.Generator().manual_seed(5))  # a shared "system prompt"


def target(slots: int, chunk: int = 0, model: torch.nn.Module | None = None) -> TorchBackend:
    return TorchBackend(model or tiny_llama(0), POSITIONS, pack=True, slots=slots, prompt_chunk=chunk)


def caches_of(backend: TorchBackend, pool_bytes: int | None = 1 << 30) -> SlotCaches:
    return SlotCaches(backend.slots, backend.prefix_blocks, PrefixPool(pool_bytes) if pool_bytes else None)


def turn(seed: int, extra: int = 12) -> torch.Tensor:
    """The shared system prompt, then a user turn of its own."""
    tail = torch.randint(1, TINY_VOCAB, (extra,), generator=torch.Generator().manual_seed(seed))
    return torch.cat([SYSTEM, tail, tail[:6]])  # a repeat, so prompt lookup drafts something


def request(prompt: torch.Tensor, sampling: SamplingConfig, logits: list[torch.Tensor], budget: int = 24) -> RowRequest:
    params = sampling_params(sampling)
    rng = torch.Generator()
    settings = RowSettings(
        params,
        sampling.seed,
        lambda slot: NgramDrafter(TINY_VOCAB, 3, 1),
        build_acceptor("probabilistic", params, rng),
        WindowPolicy(K),
        rng,
    )
    return settings.request(prompt, budget, callbacks=RowCallbacks(on_logits=logits.append))


def alone(prompt: torch.Tensor, sampling: SamplingConfig, chunk: int = 0) -> tuple[list[int], torch.Tensor]:
    """The answer and the target's logits with the prompt prefilled from position 0 (a fresh loop, no caching)."""
    logits: list[torch.Tensor] = []
    tokens = ContinuousBatchLoop(target(1, chunk), K).run(request(prompt, sampling, logits)).tokens
    return tokens, torch.cat(logits)


def run_in(loop: ContinuousBatchLoop, prompt: torch.Tensor, sampling: SamplingConfig) -> tuple[Row, torch.Tensor]:
    logits: list[torch.Tensor] = []
    row = loop.join(request(prompt, sampling, logits))
    while not row.finished:
        loop.step()
    assert row.error is None
    return row, torch.cat(logits)


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "seeded"])
@pytest.mark.parametrize("chunk", [0, 8], ids=["whole-prefill", "chunked"])
def test_a_warm_slot_hit_gives_the_answer_and_logits_of_a_prefill_from_zero(sampling, chunk):
    backend = target(2, chunk)
    loop = ContinuousBatchLoop(backend, K, caches=caches_of(backend, pool_bytes=None))  # warm slots alone
    first, second = turn(1), turn(2)
    run_in(loop, first, sampling)
    row, logits = run_in(loop, second, sampling)
    tokens, expected_logits = alone(second, sampling, chunk)
    assert row.stats.cached_tokens >= len(SYSTEM)  # the system prompt came from the first request's slot
    assert row.result().tokens == tokens
    assert torch.equal(logits, expected_logits)


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "seeded"])
def test_the_pool_restores_a_prefix_no_free_slot_holds_and_the_answer_is_the_same(sampling):
    backend = target(1)
    caches = caches_of(backend)
    loop = ContinuousBatchLoop(backend, K, caches=caches)
    run_in(loop, turn(1), sampling)
    other = torch.randint(1, TINY_VOCAB, (30,), generator=torch.Generator().manual_seed(9))
    run_in(loop, other, sampling)  # overwrites the only slot from position 0
    row, logits = run_in(loop, turn(3), sampling)
    assert row.stats.cached_tokens == len(SYSTEM) // BLOCK * BLOCK  # whole blocks of the system prompt
    tokens, expected_logits = alone(turn(3), sampling)
    assert row.result().tokens == tokens
    assert torch.equal(logits, expected_logits)


def test_restored_and_reused_positions_hold_a_fresh_prefills_keys_and_values_bit_for_bit():
    backend = target(2)
    loop = ContinuousBatchLoop(backend, K, caches=caches_of(backend))
    row, _ = run_in(loop, turn(1), GREEDY)
    fresh = target(1)
    fresh.prefill_slot(0, row.seq.committed())
    held = row.seq.length - 1
    ours, theirs = backend._forward, fresh._forward
    assert torch.equal(ours.keys[:, row.slot, :, :held], theirs.keys[:, 0, :, :held])
    assert torch.equal(ours.values[:, row.slot, :, :held], theirs.values[:, 0, :, :held])
    copy = target(1)  # the pool's blocks written into another backend's slot
    for index, key in enumerate(chain_keys(row.seq.committed()[:held], BLOCK)):
        copy.prefix_blocks.write_block(0, index, loop.caches.pool.get(key))
    whole = held // BLOCK * BLOCK
    assert torch.equal(copy._forward.keys[:, 0, :, :whole], theirs.keys[:, 0, :, :whole])
    assert torch.equal(copy._forward.values[:, 0, :, :whole], theirs.values[:, 0, :, :whole])


def test_a_prompt_that_differs_only_in_its_last_token_reuses_all_but_that_token():
    backend = target(1)
    loop = ContinuousBatchLoop(backend, K, caches=caches_of(backend, pool_bytes=None))
    prompt = turn(1)
    run_in(loop, prompt, GREEDY)
    changed = prompt.clone()
    changed[-1] = (changed[-1] % (TINY_VOCAB - 1)) + 1
    assert not torch.equal(changed, prompt)
    row, _ = run_in(loop, changed, GREEDY)
    assert row.stats.cached_tokens == len(prompt) - 1
    same, _ = run_in(loop, prompt, GREEDY)  # the very same prompt: its last token is still scored
    assert same.stats.cached_tokens == len(prompt) - 1
    assert same.result().tokens == alone(prompt, GREEDY)[0]


def test_a_request_takes_the_free_slot_with_the_longest_shared_prefix_else_the_least_recently_used():
    backend = target(3)
    caches = caches_of(backend, pool_bytes=None)
    loop = ContinuousBatchLoop(backend, K, caches=caches)
    unrelated = [torch.randint(1, TINY_VOCAB, (20,), generator=torch.Generator().manual_seed(s)) for s in (20, 21)]
    slots = [run_in(loop, prompt, GREEDY)[0].slot for prompt in (turn(1), *unrelated)]
    assert sorted(slots) == [0, 1, 2]  # empty slots first
    assert run_in(loop, turn(4), GREEDY)[0].slot == slots[0]  # the one holding the system prompt
    fresh = torch.randint(1, TINY_VOCAB, (20,), generator=torch.Generator().manual_seed(30))
    assert run_in(loop, fresh, GREEDY)[0].slot == slots[1]  # nothing shared: the least recently used


def test_rows_in_a_batch_with_hits_equal_each_request_alone():
    backend = target(3, chunk=8)
    loop = ContinuousBatchLoop(backend, K, caches=caches_of(backend))
    run_in(loop, turn(1), SAMPLED)  # the system prompt goes into a slot and the pool
    prompts = [turn(seed) for seed in (2, 3, 4)]
    rows = [loop.join(request(p, s, [])) for p, s in zip(prompts, (GREEDY, SAMPLED, GREEDY), strict=True)]
    while not all(row.finished for row in rows):
        loop.step()
    assert all(row.stats.cached_tokens >= len(SYSTEM) // BLOCK * BLOCK for row in rows)
    for row, prompt, sampling in zip(rows, prompts, (GREEDY, SAMPLED, GREEDY), strict=True):
        assert row.result().tokens == alone(prompt, sampling, chunk=8)[0]


def test_eviction_under_a_small_pool_never_changes_an_answer_and_the_pool_keeps_its_budget():
    backend = target(1)
    block_bytes = backend.prefix_blocks.read_block(0, 0).nbytes
    budget = 3 * block_bytes + block_bytes // 2  # three blocks and a half: never four
    caches = caches_of(backend, pool_bytes=budget)
    loop = ContinuousBatchLoop(backend, K, caches=caches)
    prompts = [turn(seed, extra=24) for seed in range(6)]
    prompts += [torch.randint(1, TINY_VOCAB, (50,), generator=torch.Generator().manual_seed(40 + s)) for s in range(3)]
    for prompt in prompts + prompts[::-1]:
        row = loop.join(request(prompt, GREEDY, []))
        while not row.finished:
            loop.step()
            assert caches.pool.bytes <= budget and len(caches.pool) <= 3
        assert row.result().tokens == alone(prompt, GREEDY)[0]
    assert caches.pool.evicted > 0


def test_a_chain_is_touched_so_its_first_block_is_the_last_to_go():
    pool = PrefixPool(budget_bytes=1 << 20)
    backend = target(1)
    backend.prefill_slot(0, turn(1))
    keys = chain_keys(turn(1)[:48], BLOCK)
    for index, key in enumerate(keys):
        pool.add(key, lambda index=index: backend.prefix_blocks.read_block(0, index))
    pool.touch(keys)
    assert list(pool._blocks) == keys[::-1]  # least recently used first: the chain's last block


def test_a_failed_row_leaves_nothing_to_reuse():
    backend = target(1)
    loop = ContinuousBatchLoop(backend, K, caches=caches_of(backend, pool_bytes=None))
    heard: list[torch.Tensor] = []

    def breaks_on_the_third(rows: torch.Tensor) -> None:
        heard.append(rows)
        if len(heard) == 3:
            raise RuntimeError("the caller's callback broke")

    callbacks = RowCallbacks(on_logits=breaks_on_the_third)
    row = loop.join(RowSettings(sampling_params(GREEDY)).request(turn(1), 8, callbacks=callbacks))
    while not row.finished:
        loop.step()
    assert row.error is not None
    again, _ = run_in(loop, turn(1), GREEDY)
    assert again.stats.cached_tokens == 0


def test_the_hugging_face_forward_and_the_torch_path_reuse_nothing():
    assert TorchBackend(tiny_llama(0), POSITIONS, forward="hf").prefix_blocks is None
    assert TorchBackend(tiny_llama(0), POSITIONS, pack=False).prefix_blocks is None  # GEMMs round by row count


def perturbed(model: torch.nn.Module) -> torch.nn.Module:
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=torch.Generator().manual_seed(3)) * 0.2 * param.abs().mean())
    return model


def model_drafters(backend: TorchBackend, params, rng):
    """A draft model with a slot per target slot (its cache recomputed at each prefill)."""
    draft = target(backend.slots, model=perturbed(tiny_llama(0, layers=3)))
    return lambda slot: ModelDrafter(SlotView(draft, slot), params, rng)


def eagle_drafters(backend: TorchBackend, params, rng):
    """An EAGLE-3 head over the target's taps, its cache one slot per target slot (shared by the requests)."""
    model = EagleModel(tiny_head(vocab_size=TINY_VOCAB), backend)
    return lambda slot: EagleDrafter(model, slot, params, rng)


@pytest.mark.parametrize("drafters", [model_drafters, eagle_drafters], ids=["draft-model", "eagle3"])
@pytest.mark.parametrize("chunk", [0, 8], ids=["whole-prefill", "chunked"])
def test_a_draft_model_and_an_eagle_head_keep_the_answer_with_a_hit(drafters, chunk):
    params = sampling_params(SAMPLED)
    prompts = (turn(1), turn(2), turn(1))

    def answers(caches: bool) -> list[tuple[list[int], int]]:
        backend = target(1, chunk, model=tiny_llama(0, layers=3))  # 3 layers: the head taps 0, 1, 2
        rng = torch.Generator()
        drafter_for = drafters(backend, params, rng)
        loop = ContinuousBatchLoop(backend, K, caches=caches_of(backend, pool_bytes=None) if caches else None)
        results = []
        for prompt in prompts:
            settings = RowSettings(
                params, SAMPLED.seed, drafter_for, build_acceptor("probabilistic", params, rng), WindowPolicy(K), rng
            )
            row = loop.join(settings.request(prompt, 20))
            while not row.finished:
                loop.step()
            assert row.error is None
            stats = row.stats
            results.append((row.result().tokens, stats.cached_tokens, stats.accepted_at, stats.proposed_at))
        return results

    with_hits, cold = answers(caches=True), answers(caches=False)
    assert [tokens for tokens, *_ in with_hits] == [tokens for tokens, *_ in cold]
    # the drafts too (the answer alone would not show a stale draft cache: rejection sampling corrects any draft)
    assert [tuple(drafts) for *_, accepted, drafts in with_hits] == [tuple(d) for *_, a, d in cold]
    assert [accepted for *_, accepted, _ in with_hits] == [accepted for *_, accepted, _ in cold]
    assert [cached for _, cached, *_ in cold] == [0, 0, 0]
    # the system prompt (turn 2 shares it with turn 1; turn 1 again shares it with turn 2, which took the one slot)
    assert all(cached >= len(SYSTEM) - BLOCK for _, cached, *_ in with_hits[1:])


def test_an_eagle_rows_reuse_stops_where_its_heads_cache_pairs_a_token_the_new_prompt_does_not_have():
    """Head position p pairs the target's taps at p with token p + 1: with prompts sharing n tokens, positions
    0..n-2 hold pairs of the new prompt, position n-1 the old prompt's token n."""
    backend = target(1)
    caches = caches_of(backend, pool_bytes=None)
    old = turn(1)
    caches.admit([0], old)
    caches.left(0, old, head=len(old))  # the head fed every position the target holds
    new = turn(2)
    shared = len(SYSTEM) + int((old[len(SYSTEM) :] == new[len(SYSTEM) : len(old)]).cumprod(0).sum())
    admission = caches.admit([0], new)
    assert (admission.reused, admission.head) == (shared, shared - 1)
    caches.left(0, new, head=20)  # a head that fed only 20 positions
    assert caches.admit([0], new).head == 20


def test_requests_that_join_together_with_one_system_prompt_prefill_it_once():
    backend = target(3, chunk=8)
    loop = ContinuousBatchLoop(backend, K, caches=caches_of(backend))
    prompts = [turn(seed) for seed in (2, 3, 4)]
    rows = [loop.join(request(prompt, GREEDY, [])) for prompt in prompts]
    assert [row.stats.cached_tokens for row in rows] == [0, 0, 0]  # nothing held when they joined
    scored = 0  # prompt tokens the target scored
    score_batch = backend.score_batch

    def counted(segments):
        nonlocal scored
        scored += sum(len(segment.tokens) for segment in segments if segment.logits_rows is not None)
        return score_batch(segments)

    backend.score_batch = counted
    while not all(row.finished for row in rows):
        loop.step()
    whole = len(SYSTEM) // BLOCK * BLOCK
    assert [row.stats.cached_tokens for row in rows] == [0, whole, whole]  # copied from the first one's blocks
    assert scored == sum(len(p) for p in prompts) - 2 * whole
    for row, prompt in zip(rows, prompts, strict=True):
        assert row.result().tokens == alone(prompt, GREEDY, chunk=8)[0]
