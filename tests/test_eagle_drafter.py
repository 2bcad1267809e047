"""The EAGLE-3 drafter in our loop: its drafts are the head's chain over the target's own hidden states (checked
against the head's training path fed by Hugging Face's output_hidden_states), they map into the target
vocabulary through d2t, and the loop's outputs are plain decoding's: greedy equal, a row in a batch equal to it
alone, a seeded sample the same whatever the batch."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_llama
from eagle_support import tiny_head

from neuron_ssp.backends.base import SingleSlot
from neuron_ssp.backends.torch.scoring import TorchBackend
from neuron_ssp.drafters.base import Draft
from neuron_ssp.drafters.eagle import EagleDrafter, EagleModel
from neuron_ssp.drafters.eagle_head import EagleHead
from neuron_ssp.engines.continuous_batch import ContinuousBatchLoop
from neuron_ssp.engines.rows import RowRequest, RowSettings
from neuron_ssp.errors import UsageError
from neuron_ssp.speculation.acceptors import ProbabilisticAcceptor
from neuron_ssp.speculation.policies import FixedPolicy
from neuron_ssp.speculation.sampling import SamplingParams

VOCAB, DRAFT_VOCAB, LAYERS, TAPS, K = 16, 10, 4, (1, 3, 2), 4
PROMPTS = [
    torch.tensor([1, 5, 7, 9, 5, 7, 11, 3]),
    torch.tensor([3, 2, 8]),
    torch.tensor([4, 4, 12, 13, 14, 15, 0, 1, 2, 3, 4]),
]
GREEDY, SAMPLED = SamplingParams(), SamplingParams(temperature=1.0)


def target(forward: str = "compact", pack: bool | None = None, chunk: int = 0, slots: int = 4) -> TorchBackend:
    return TorchBackend(
        tiny_llama(2, vocab_size=VOCAB, layers=LAYERS), 256, forward=forward, pack=pack, slots=slots, prompt_chunk=chunk
    )


def eagle(backend: TorchBackend, seed: int = 0) -> EagleModel:
    return EagleModel(tiny_head(VOCAB, DRAFT_VOCAB, TAPS, seed=seed, scale=1.0), backend)


def request(model: EagleModel | None, prompt: torch.Tensor, params: SamplingParams, seed: int = 0, new: int = 24):
    drafter_for = None if model is None else (lambda slot: EagleDrafter(model, slot, params))
    settings = RowSettings(
        params, seed, drafter_for=drafter_for, acceptor=ProbabilisticAcceptor(params), policy=FixedPolicy(K)
    )
    return RowRequest(prompt, new, settings=settings)


def run_batch(backend: TorchBackend, requests: list[RowRequest]) -> list[list[int]]:
    loop = ContinuousBatchLoop(backend, K)
    rows = [loop.join(each) for each in requests]
    while loop.rows:
        loop.step()
    assert all(row.error is None for row in rows), [row.error for row in rows]
    return [row.seq.generated() for row in rows]


class Recording(EagleDrafter):
    """Keeps every (committed tokens, draft) it proposed."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen: list[tuple[list[int], Draft]] = []

    def propose(self, sequence: torch.Tensor, max_tokens: int) -> Draft:
        draft = super().propose(sequence, max_tokens)
        self.seen.append((sequence.tolist(), draft))
        return draft


@torch.no_grad()
def reference_chain(model: EagleModel, hf_model, committed: list[int], length: int) -> list[int]:
    """The greedy chain from the head's TRAINING path: taps from Hugging Face's output_hidden_states over the
    committed tokens but the last, then training-time-test steps, each on the sequence extended by its draft."""
    head: EagleHead = model.head
    out = hf_model(input_ids=torch.tensor([committed[:-1]]), output_hidden_states=True)
    hidden = head.fuse(torch.cat([out.hidden_states[layer] for layer in TAPS], -1))
    extended, steps, chain = list(committed), None, []
    n = len(committed)
    for step in range(length):
        hidden, steps = head(hidden, torch.tensor([extended[1 + step : n + step]]), steps)
        token = int(model.draft_ids[head.logits(hidden[0, -1]).argmax()])
        chain.append(token)
        extended.append(token)
    return chain


@pytest.mark.parametrize(
    ("forward", "pack", "chunk"),
    [("compact", True, 0), ("compact", True, 3), ("compact", False, 0), ("hf", None, 0)],
    ids=["row-kernel", "row-kernel-chunked-prefill", "torch-path", "hf"],
)
def test_drafts_are_the_heads_chain_over_the_targets_hidden_states(forward, pack, chunk):
    backend = target(forward, pack, chunk, slots=1)
    model = eagle(backend)
    drafter = Recording(model, 0, GREEDY)
    req = request(model, PROMPTS[0], GREEDY)
    req.settings.drafter_for = lambda slot: drafter
    ContinuousBatchLoop(backend, K).run(req)
    assert len(drafter.seen) > 5
    for committed, draft in drafter.seen:
        assert draft.tokens.tolist() == reference_chain(model, backend.model, committed, len(draft)), committed


def test_the_draft_distribution_lives_on_the_draft_vocabulary_mapped_through_d2t():
    backend = target(slots=1)
    model = eagle(backend)
    drafter = Recording(model, 0, SAMPLED)
    req = request(model, PROMPTS[1], SAMPLED, seed=3)
    req.settings.drafter_for = lambda slot: drafter
    ContinuousBatchLoop(backend, K).run(req)
    allowed = torch.zeros(VOCAB, dtype=torch.bool)
    allowed[model.draft_ids] = True
    for _, draft in drafter.seen:
        assert allowed[draft.tokens].all()
        assert torch.isneginf(draft.logits[:, ~allowed]).all() and torch.isfinite(draft.logits[:, allowed]).all()


@pytest.mark.parametrize("chunk", [0, 3])
def test_greedy_ssp_equals_plain_decoding(chunk):
    backend = target(chunk=chunk)
    model = eagle(backend)
    accepted = 0
    for prompt in PROMPTS:
        loop = ContinuousBatchLoop(backend, K)
        ssp = loop.run(request(model, prompt, GREEDY))
        assert ssp.tokens == ContinuousBatchLoop(backend, 1).run(request(None, prompt, GREEDY)).tokens
        accepted += ssp.stats.accepted_tokens
    assert accepted > 0  # some drafts were kept: the rollback of a partly accepted chain ran


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_a_row_in_a_batch_equals_it_alone(params):
    backend = target()
    model = eagle(backend)
    alone = [run_batch(backend, [request(model, prompt, params, seed)])[0] for seed, prompt in enumerate(PROMPTS)]
    together = run_batch(backend, [request(model, prompt, params, seed) for seed, prompt in enumerate(PROMPTS)])
    assert together == alone


def test_a_seeded_sample_is_plain_sampling_whatever_the_batch():
    backend = target(chunk=4)
    model = eagle(backend)
    plain = [run_batch(backend, [request(None, prompt, SAMPLED, 7)])[0] for prompt in PROMPTS]
    batched = run_batch(backend, [request(model, prompt, SAMPLED, 7) for prompt in PROMPTS])
    reordered = run_batch(backend, [request(model, prompt, SAMPLED, 7) for prompt in reversed(PROMPTS)])
    assert batched == plain and list(reversed(reordered)) == plain


def test_a_head_for_another_target_is_refused_naming_what_differs():
    backend = target()
    with pytest.raises(UsageError) as err:
        EagleModel(tiny_head(VOCAB + 1, DRAFT_VOCAB, (1, 2, 5)), backend)
    rules = " | ".join(problem.rule for problem in err.value.problems)
    assert "vocabulary of 17 tokens; the target has 16" in rules and "4 layers" in rules


def test_a_backend_without_hidden_states_is_refused():
    class Opaque(SingleSlot):
        name, vocab_size, n_positions, max_score_width = "neuron", VOCAB, 64, None

    with pytest.raises(UsageError, match="does not return"):
        EagleModel(tiny_head(VOCAB, DRAFT_VOCAB, TAPS), Opaque())  # type: ignore[arg-type]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_the_head_drafts_where_the_target_runs():
    backend = TorchBackend(tiny_llama(2, vocab_size=VOCAB, layers=LAYERS).cuda(), 256, slots=2)
    model = eagle(backend)
    assert model.head.fc.device.type == "cuda" and model.cache.keys.device.type == "cuda"
    for params in (GREEDY, SAMPLED):
        ssp = ContinuousBatchLoop(backend, K).run(request(model, PROMPTS[0], params, seed=1))
        assert ssp.tokens == ContinuousBatchLoop(backend, 1).run(request(None, PROMPTS[0], params, seed=1)).tokens
