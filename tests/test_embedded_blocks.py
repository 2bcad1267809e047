"""The embedded model on its GGUF's Q4_1/Q8_0 blocks (platform.weights auto, the default): every matrix product of the
model is the fp32 kernel's bit for bit, and greedy and speculative answers on dev prompts are the fp32 path's."""

from __future__ import annotations

import pytest
import torch

from neuron_ssp.config import load_config
from neuron_ssp.engines.native import plain_generate
from neuron_ssp.pipeline.load import load_pipeline
from neuron_ssp.tools.prompt_set import load_prompts

pytestmark = pytest.mark.slow


def test_every_matrix_and_every_answer_is_the_fp32_paths(use_embedded_cache: str):
    torch.set_num_threads(1)
    fp32 = load_pipeline(load_config(overrides={"platform.weights": "fp32"}))
    blocks = load_pipeline(load_config())  # auto
    assert blocks.target.weights_from_blocks and not fp32.target.weights_from_blocks
    ours, theirs = blocks.target._forward.w, fp32.target._forward.w
    pairs = [(a.panels(), b.panels()) for a, b in zip(ours.layers, theirs.layers, strict=True)]
    matrices = [(x, y) for a, b in pairs for x, y in zip(a, b, strict=True)] + [(ours.head.panels, theirs.head.panels)]
    assert len(matrices) == 121 and all(x.format != 0 for x, _ in matrices)  # 120 layer matrices and the head
    kernel = ours.head.kernel
    for block_panels, fp32_panels in matrices:
        x = torch.randn(5, block_panels.in_features)
        assert torch.equal(kernel.linear(x, block_panels), kernel.linear(x, fp32_panels))
    assert sum(x.data.numel() for x, _ in matrices) < 120e6  # bytes read a token: ~112 MB against 538 MB
    for prompt in [p.text for p in load_prompts()[:3]]:
        ids = blocks.encode(prompt)
        expected = plain_generate(fp32.target, ids, 32, fp32.config.sampling, fp32.eos_token_ids).tokens
        assert plain_generate(blocks.target, ids, 32, blocks.config.sampling, blocks.eos_token_ids).tokens == expected
        assert blocks.generator.generate(ids, 32, blocks.eos_token_ids).tokens == expected
