"""The EAGLE-3 head: the drafting path (rows of cache slots) computes what the training path (whole sequences,
training-time test) computes, and a checkpoint goes in and out unchanged."""

from __future__ import annotations

import torch
from eagle_support import tiny_head

from neuron_ssp.drafters.eagle_head import EagleHead, HeadCache

LENGTH = 12


def head_and_inputs(seed: int = 0) -> tuple[EagleHead, torch.Tensor, torch.Tensor]:
    checkpoint = tiny_head(seed=seed)
    head = EagleHead.from_checkpoint(checkpoint, torch.randn(97, 32, generator=torch.Generator().manual_seed(5)))
    generator = torch.Generator().manual_seed(seed + 1)
    taps = torch.randn(1, LENGTH + 3, 96, generator=generator)
    tokens = torch.randint(0, 97, (1, LENGTH + 3), generator=generator)
    return head, taps, tokens


@torch.no_grad()
def test_decode_in_chunks_equals_the_whole_sequence():
    head, taps, tokens = head_and_inputs()
    hidden = head.fuse(taps[:, :LENGTH])
    whole, _ = head(hidden, tokens[:, :LENGTH])
    cache = HeadCache(head.config, slots=3, n_positions=64)
    parts, begin = [], 0
    for count in (5, 1, 6):  # a prompt, one committed token, several
        rows = slice(begin, begin + count)
        parts.append(head.decode(hidden[0, rows], tokens[0, rows], [(2, begin, count)], cache))
        begin += count
    assert torch.allclose(torch.cat(parts), whole[0], atol=1e-5)


@torch.no_grad()
def test_rows_of_two_slots_in_one_call_equal_each_alone():
    head, taps, tokens = head_and_inputs()
    hidden = head.fuse(taps[0, :LENGTH])
    together = HeadCache(head.config, slots=2, n_positions=64)
    both = head.decode(
        torch.cat([hidden[:7], hidden[:4]]),
        torch.cat([tokens[0, :7], tokens[0, 3:7]]),
        [(0, 0, 7), (1, 0, 4)],
        together,
    )
    alone = HeadCache(head.config, slots=2, n_positions=64)
    first = head.decode(hidden[:7], tokens[0, :7], [(0, 0, 7)], alone)
    second = head.decode(hidden[:4], tokens[0, 3:7], [(1, 0, 4)], alone)
    assert torch.allclose(both, torch.cat([first, second]), atol=1e-6)


@torch.no_grad()
def test_a_drafted_chain_equals_training_time_test_steps():
    """Chain step s drafted from position p sees what training step s sees at p (SafeAILab cnets.py:253-305):
    step 0's keys up to p and each earlier step's key at p, at rope position p + s."""
    head, taps, tokens = head_and_inputs(seed=3)
    hidden0 = head.fuse(taps[:, :LENGTH])
    out0, steps = head(hidden0, tokens[:, :LENGTH])
    out1, steps = head(out0, tokens[:, 1 : LENGTH + 1], steps)
    out2, _ = head(out1, tokens[:, 2 : LENGTH + 2], steps)
    p = 6
    cache = HeadCache(head.config, slots=1, n_positions=64)
    chain0 = head.decode(hidden0[0, : p + 1], tokens[0, : p + 1], [(0, 0, p + 1)], cache)[-1]
    chain1 = head.decode(chain0.view(1, -1), tokens[0, p + 1 : p + 2], [(0, p + 1, 1)], cache)[-1]
    chain2 = head.decode(chain1.view(1, -1), tokens[0, p + 2 : p + 3], [(0, p + 2, 1)], cache)[-1]
    assert torch.allclose(chain0, out0[0, p], atol=1e-5)
    assert torch.allclose(chain1, out1[0, p], atol=1e-5)
    assert torch.allclose(chain2, out2[0, p], atol=1e-5)


@torch.no_grad()
def test_rolling_back_a_chain_is_overwriting_it():
    head, taps, tokens = head_and_inputs()
    hidden = head.fuse(taps[0, :LENGTH])
    cache = HeadCache(head.config, slots=1, n_positions=64)
    head.decode(hidden[:6], tokens[0, :6], [(0, 0, 6)], cache)
    head.decode(torch.randn(3, 32), torch.tensor([1, 2, 3]), [(0, 6, 3)], cache)  # a chain, then rejected
    resumed = head.decode(hidden[6:9], tokens[0, 6:9], [(0, 6, 3)], cache)
    fresh = HeadCache(head.config, slots=1, n_positions=64)
    assert torch.allclose(resumed, head.decode(hidden[:9], tokens[0, :9], [(0, 0, 9)], fresh)[6:], atol=1e-5)


def test_checkpoint_in_and_out_is_unchanged_and_trainable():
    checkpoint = tiny_head()
    head = EagleHead.from_checkpoint(checkpoint, torch.randn(97, 32))
    back = head.to_checkpoint(checkpoint.tensors["d2t"], checkpoint.tensors["t2d"])
    assert set(back.tensors) == set(checkpoint.tensors)
    assert all(torch.equal(back.tensors[name], tensor) for name, tensor in checkpoint.tensors.items())
    assert torch.equal(head.target_ids, checkpoint.target_ids)
    head.zero_grad()
    out, _ = head(head.fuse(torch.randn(1, 5, 96)), torch.randint(0, 97, (1, 5)))
    head.logits(out).logsumexp(-1).sum().backward()
    assert head.fc.grad is not None and head.embed.grad is None  # the target's embedding stays frozen
