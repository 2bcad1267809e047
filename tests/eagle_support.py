"""Tiny random EAGLE-3 heads for tests (tests/test_eagle_*.py), in the standard checkpoint layout."""

from __future__ import annotations

import torch

from neuron_ssp.drafters.eagle_checkpoint import EagleCheckpoint, parse_config, tensor_shapes, vocab_maps

TINY_HIDDEN = 32  # tests/conftest.py tiny_llama's width


def tiny_head(
    vocab_size: int = 97,
    draft_vocab_size: int = 40,
    taps: tuple[int, ...] | None = (0, 1, 2),
    seed: int = 0,
    scale: float = 0.3,
    hidden: int = TINY_HIDDEN,
) -> EagleCheckpoint:
    """A head of random weights over a random draft vocabulary of `draft_vocab_size` target ids; `scale` sets how
    peaked its drafts are. Width, heads and kv heads match tests/conftest.py's tiny_llama."""
    raw = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_hidden_layers": 1,
        "vocab_size": vocab_size,
        "draft_vocab_size": draft_vocab_size,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 512,
    }
    if taps is not None:
        raw["eagle_aux_hidden_state_layer_ids"] = list(taps)
    config, problems = parse_config(raw, "config.json")
    assert config is not None, problems
    generator = torch.Generator().manual_seed(seed)
    tensors = {
        name: (1 + 0.1 * torch.randn(shape, generator=generator))
        if len(shape) == 1
        else scale * torch.randn(shape, generator=generator)
        for name, shape in tensor_shapes(config).items()
        if name not in ("d2t", "t2d")
    }
    if draft_vocab_size != vocab_size:
        chosen = torch.randperm(vocab_size, generator=generator)[:draft_vocab_size]
        tensors["d2t"], tensors["t2d"] = vocab_maps(chosen, vocab_size)
    return EagleCheckpoint(config, tensors)
