"""train-draft on a tiny random target: a few steps, a resumed run, a loadable EAGLE-3 head; the pieces it stands on."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
import yaml
from click.testing import CliRunner
from conftest import tiny_llama

from neuron_ssp.cli import main
from neuron_ssp.drafters.eagle_checkpoint import head_config_for, read_checkpoint
from neuron_ssp.drafters.eagle_head import EagleHead
from neuron_ssp.tools.draft_data import Finished, load_conversations, write_shard
from neuron_ssp.tools.draft_eval import leading_run, ngram_walk, walk
from neuron_ssp.tools.draft_plots import curve_series, init_label, plot_curve
from neuron_ssp.tools.draft_vocab import answer_token_counts, coverage_of, top_ids
from neuron_ssp.tools.train_draft import (
    TOP_K,
    Batch,
    batches,
    held_out_index,
    new_head,
    training_time_test,
)

VOCAB = 97
LAYERS = 8  # taps 2, 4, 5


@pytest.fixture
def tiny_run(tmp_path):
    """A tiny target saved as a model directory, a config naming it, and 40 conversations of its vocabulary."""
    model = tiny_llama(0, VOCAB, layers=LAYERS)
    model.save_pretrained(tmp_path / "target")
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "platform": {"backend": "torch", "device": "cpu"},
                "target": {"path": str(tmp_path / "target"), "dtype": "fp32", "n_positions": 256},
                "speculation": {"drafter": "ngram", "k": 4, "policy": "fixed", "ngram_max": 3},
            }
        )
    )
    rng = random.Random(0)
    finished = []
    for index in range(40):
        length = rng.randrange(20, 60)
        ids = [rng.randrange(3, 40) for _ in range(length)]
        finished.append(Finished(index, "topic", 0.0 if index % 2 == 0 else 0.7, ids, 8))
    (tmp_path / "data").mkdir()
    write_shard(tmp_path / "data", 0, finished[:25])
    write_shard(tmp_path / "data", 1, finished[25:])
    return tmp_path, config


def train_args(tmp_path, config, minutes: str) -> list[str]:
    return [
        "train-draft",
        "--config",
        str(config),
        "--data",
        str(tmp_path / "data"),
        "--work",
        str(tmp_path / "work"),
        "--minutes",
        minutes,
        "--draft-vocab",
        "32",
        "--ttt-steps",
        "3",
        "--batch-tokens",
        "128",
        "--held-out",
        "0.2",
        "--eval-every",
        "2",
        "--threads",
        "1",
    ]


def test_train_draft_writes_a_loadable_head_and_resumes(tiny_run):
    tmp_path, config = tiny_run
    first = CliRunner().invoke(main, train_args(tmp_path, config, "0.03"))
    assert first.exit_code == 0, first.output
    state = torch.load(tmp_path / "work" / "train_state.pt", weights_only=False)
    steps = state["state"]["step"]
    assert steps >= 1
    checkpoint = read_checkpoint(tmp_path / "work" / "head")
    assert checkpoint.config.draft_vocab_size == 32
    assert checkpoint.config.taps == (2, 4, 5)
    assert checkpoint.tensors["lm_head.weight"].dtype == torch.float16
    head = EagleHead.from_checkpoint(checkpoint, tiny_llama(0, VOCAB, layers=LAYERS).get_input_embeddings().weight)
    saved_head = {k: v.to(torch.float16).float() for k, v in state["head"].items()}
    assert torch.equal(head.lm_head.detach(), saved_head["lm_head"])
    recipe = json.loads((tmp_path / "work" / "head" / "recipe.json").read_text())
    assert recipe["steps"] == steps and recipe["settings"]["ttt_steps"] == 3
    assert set(recipe["held_out"]["tau"]) == {"2", "3", "4", "5", "6", "8"}

    second = CliRunner().invoke(main, train_args(tmp_path, config, "0.03"))
    assert second.exit_code == 0, second.output
    assert "resuming" in second.output
    resumed = torch.load(tmp_path / "work" / "train_state.pt", weights_only=False)
    assert resumed["state"]["step"] > steps
    assert resumed["meta"]["train_index"] == state["meta"]["train_index"]


def test_a_resumed_run_with_other_settings_is_refused(tiny_run):
    tmp_path, config = tiny_run
    assert CliRunner().invoke(main, train_args(tmp_path, config, "0.01")).exit_code == 0
    args = train_args(tmp_path, config, "0.01")
    args[args.index("--ttt-steps") + 1] = "2"
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2
    text = " ".join(result.output.replace("│", " ").split())
    assert "ttt_steps" in text and "has ttt_steps = 3" in text and "another --work directory" in text


def test_draft_vocab_must_be_auto_or_a_positive_integer(tiny_run):
    tmp_path, config = tiny_run
    args = train_args(tmp_path, config, "0.01")
    args[args.index("--draft-vocab") + 1] = "many"
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2 and "--draft-vocab" in result.output


def test_training_lowers_the_loss_on_a_fixed_batch():
    """The training-time test's loss is differentiable end to end: a few AdamW steps on one batch lower it (the
    target's head is sharpened so its distributions have little entropy: the loss can fall well below its start)."""
    target = tiny_llama(0, VOCAB, layers=LAYERS)
    with torch.no_grad():
        target.lm_head.weight.mul_(40)
    batch = features_of(target, [list(range(3, 33)), list(range(10, 40))])
    draft_ids = torch.arange(VOCAB)
    head = new_head(target, head_config_for(target.config.to_dict(), VOCAB, (2, 4, 5)), draft_ids, None, False)
    in_draft = torch.ones(VOCAB, dtype=torch.bool)
    optimizer = torch.optim.AdamW(head.parameters(), lr=3e-3)
    first = None
    for _ in range(30):
        result = training_time_test(head, batch, 3, in_draft)
        loss = sum(0.8**i * x for i, x in enumerate(result.losses))
        first = first if first is not None else float(loss.detach())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert float(loss.detach()) < 0.7 * first


def test_training_time_test_targets_the_token_two_ahead():
    """Step i at position p is scored against the target's distribution at p + 1 + i: a head whose draft equals
    that argmax everywhere is right at every counted position of every step."""
    target = tiny_llama(0, VOCAB, layers=LAYERS)
    batch = features_of(target, [list(range(3, 30))], answer_start=5)
    head = new_head(
        target, head_config_for(target.config.to_dict(), VOCAB, (2, 4, 5)), torch.arange(VOCAB), None, False
    )

    step = {"i": 0}
    original = head.logits

    def oracle_logits(hidden):
        """All mass on the target's argmax at the position this step is scored against."""
        shift = 1 + step["i"]
        step["i"] += 1
        t = batch.ids.shape[1]
        q = (torch.arange(t) + shift).clamp(max=t - 1)
        return torch.nn.functional.one_hot(batch.target_argmax[:, q], VOCAB).float() * 10 + 0 * original(hidden)

    head.logits = oracle_logits  # type: ignore[method-assign]
    result = training_time_test(head, batch, 3, torch.ones(VOCAB, dtype=torch.bool))
    assert result.correct == result.counted
    assert result.counted == [22, 22, 22]  # every step: the predicted token is one of the answer's 5..26


def test_a_head_can_start_from_the_targets_output_rows_or_layer():
    target = tiny_llama(0, VOCAB, layers=LAYERS)
    config = head_config_for(target.config.to_dict(), 32, (2, 4, 5))
    draft_ids = torch.arange(0, 64, 2)
    plain = new_head(target, config, draft_ids, None, False)
    rows = new_head(target, config, draft_ids, None, True)
    layer = new_head(target, config, draft_ids, 5, False)
    assert torch.equal(rows.lm_head, target.lm_head.weight[draft_ids]) and not torch.equal(plain.lm_head, rows.lm_head)
    assert torch.equal(rows.norm, target.model.norm.weight) and torch.equal(layer.lm_head, rows.lm_head)
    assert torch.equal(layer.gate, target.model.layers[5].mlp.gate_proj.weight)
    assert torch.equal(layer.q[:, 32:], target.model.layers[5].self_attn.q_proj.weight) and not layer.q[:, :32].any()


def features_of(target, conversations: list[list[int]], answer_start: int = 2) -> Batch:
    from neuron_ssp.backends.torch.scoring import TorchBackend
    from neuron_ssp.tools.train_draft import collate, target_features

    backend = TorchBackend(target, 128, slots=len(conversations))
    backend.set_taps([2, 4, 5])
    ids = [np.asarray(c) for c in conversations]
    return collate(
        target_features(backend, ids, torch.arange(VOCAB)),
        ids,
        [answer_start] * len(conversations),
        [True] * len(conversations),
    )


def test_target_features_are_the_hf_forward_of_each_conversation():
    """Taps (fp16), the argmax and the top-K soft target of each row are Hugging Face's forward of that
    conversation alone; past a conversation's end everything is padding."""
    target = tiny_llama(0, VOCAB, layers=LAYERS)
    a, b = list(range(3, 20)), list(range(30, 60))
    batch = features_of(target, [a, b])
    with torch.no_grad():
        out = target(torch.tensor([b]), output_hidden_states=True)
    taps = torch.cat([out.hidden_states[layer][0] for layer in (2, 4, 5)], -1)
    torch.testing.assert_close(batch.taps[1, : len(b)], taps, atol=2e-3, rtol=2e-3)
    assert torch.equal(batch.target_argmax[1, : len(b)], out.logits[0].argmax(-1))
    probs = out.logits[0].softmax(-1)
    top = probs.topk(TOP_K, -1)
    assert torch.equal(batch.top_ids[1, : len(b)], top.indices)
    torch.testing.assert_close(
        batch.top_p[1, : len(b)], top.values / top.values.sum(-1, keepdim=True), atol=1e-3, rtol=1e-3
    )
    assert int(batch.lengths[0]) == len(a) and torch.all(batch.ids[0, len(a) :] == 0)
    assert torch.all(batch.top_p[0, len(a) :] == 0)


def test_the_feature_cache_reuses_what_fits_and_recomputes_the_rest():
    from neuron_ssp.backends.torch.scoring import TorchBackend
    from neuron_ssp.tools.draft_data import Conversations
    from neuron_ssp.tools.train_draft import FeatureCache

    backend = TorchBackend(tiny_llama(0, VOCAB, layers=LAYERS), 128, slots=2)
    backend.set_taps([2, 4, 5])
    calls = []
    score = backend.score_batch_hidden
    backend.score_batch_hidden = lambda segments: calls.append(len(segments)) or score(segments)  # type: ignore
    data = Conversations([np.arange(3, 30), np.arange(5, 20), np.arange(7, 40)], [2, 2, 2], [0, 1, 2], [0.0] * 3)
    sizing = FeatureCache(10**9)
    sizing.batch(backend, data, [0], torch.arange(VOCAB))
    calls.clear()
    cache = FeatureCache(sizing.bytes)  # room for conversation 0's features only
    first = cache.batch(backend, data, [0, 1], torch.arange(VOCAB))
    second = cache.batch(backend, data, [0, 1], torch.arange(VOCAB))
    assert list(cache.items) == [0] and calls == [2, 1]  # one call for both, then for conversation 1 only
    assert torch.equal(first.taps, second.taps) and torch.equal(first.top_ids, second.top_ids)


def test_draft_vocabulary_is_the_most_frequent_answer_tokens_sorted():
    ids = [np.array([9, 9, 5, 5, 5, 7, 1]), np.array([0, 0, 0, 0, 7])]
    counts = answer_token_counts(ids, [2, 3], 10)  # answers: [5 5 5 7 1] and [0 7]
    assert counts.tolist() == [1, 1, 0, 0, 0, 3, 0, 2, 0, 0]
    assert top_ids(counts, 3).tolist() == [0, 5, 7]  # 5 (3), 7 (2), then the lower of the ties 0 and 1
    assert coverage_of(counts, counts, 2) == pytest.approx(5 / 7)


def test_walk_counts_tokens_per_call_like_spec_bench():
    # answer from position 2 of 10 tokens; the chain from p accepts accepted_at[p] drafts
    accepted_at = [0, 3, 0, 0, 0, 1, 0, 0, 0, 0]
    # c=2: p=1 accepts 3 -> c=6; p=5 accepts 1 -> c=8; p=7: 0 (and room for 0) -> c=9: end. 3 calls, 7 tokens
    assert walk(accepted_at, 2, 10, 8) == (7, 3)
    assert walk(accepted_at, 2, 10, 2) == (7, 5)  # window 2: one draft a call at most
    assert leading_run(torch.tensor([[1, 1, 0], [1, 0, 1], [0, 0, 1]], dtype=torch.bool)).tolist() == [2, 1, 0]


def test_ngram_walk_accepts_a_copied_span():
    ids = torch.tensor([5, 6, 7, 8, 9, 1, 5, 6, 7, 8, 9])
    committed, calls = ngram_walk(ids, 6, 8)
    assert committed == 4 and calls == 1  # at c=6 ("5") lookup proposes 6 7 8 9 1 5 6: 6 7 8 9 are right


def test_held_out_share_and_batches():
    held = [i for i in range(10000) if held_out_index(i, 0.05)]
    assert 400 < len(held) < 600
    assert {i % 4 for i in held} == {0, 1, 2, 3}  # greedy answers (index % 4 == 0) are held out too
    assert batches([0, 1, 2, 3], [50, 60, 200, 10], 128) == [[0, 1], [2], [3]]


def test_shards_round_trip(tmp_path):
    write_shard(tmp_path, 0, [Finished(3, "magpie", 0.7, [1, 2, 3], 1), Finished(1, "topic", 0.0, [4, 5], 1)])
    write_shard(tmp_path, 1, [Finished(2, "passage", 0.7, [], 0)])  # skipped conversations keep their index
    data = load_conversations(tmp_path)
    assert data.index == [1, 3] and [x.tolist() for x in data.ids] == [[4, 5], [1, 2, 3]]
    assert data.temperature == [0.0, pytest.approx(0.7)] and data.answer_start == [1, 1]


def test_the_curve_draws_one_line_per_start_in_order_of_training_tokens(tmp_path):
    def point(tokens, settings, tau):
        label = init_label(settings)
        return {
            "label": label,
            "train_tokens": tokens,
            "accuracy": [0.3, 0.2],
            "tau": {"3": tau},
            "ngram_tau": {"3": 1.5},
        }

    random_100k, random_40k = point(100_000, {"init_layer": None}, 1.3), point(40_000, {}, 1.2)
    layer = point(40_000, {"init_layer": 27, "init_lm_head": True}, 1.1)
    lm_head = point(40_000, {"init_layer": None, "init_lm_head": True}, 1.0)
    series = curve_series([random_100k, layer, random_40k, lm_head])
    assert series == {
        "random init": [random_40k, random_100k],
        "init from layer 27": [layer],
        "lm-head init": [lm_head],
    }
    pytest.importorskip("matplotlib")
    plot_curve([random_100k, layer, random_40k, lm_head], tmp_path / "curve.png", "curve")
    assert (tmp_path / "curve.png").stat().st_size > 0
