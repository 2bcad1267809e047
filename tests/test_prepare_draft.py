"""`neuron-ssp prepare-draft`: a reduced-vocabulary EAGLE-3 head widened for NxD Inference drafts the same greedy
tokens, carries the target's embedding under NxDI's names, and reads back through the one checkpoint reader."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from eagle_support import tiny_head
from safetensors.torch import load_file
from transformers import LlamaConfig, LlamaForCausalLM

from neuron_ssp.cli import main
from neuron_ssp.drafters.eagle_checkpoint import read_checkpoint, write_checkpoint
from neuron_ssp.drafters.eagle_head import EagleHead
from neuron_ssp.errors import UsageError
from neuron_ssp.tools.prepare_draft import prepare_draft, widen_lm_head

VOCAB = 97


def save_target(directory: Path, vocab: int = VOCAB, hidden: int = 32) -> Path:
    torch.manual_seed(7)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    LlamaForCausalLM(config).save_pretrained(directory)
    return directory


def greedy_drafts(head: EagleHead, target_ids: torch.Tensor, seed: int) -> torch.Tensor:
    """Target ids of the head's greedy drafts over random taps and tokens, a chain of 3 training-time steps."""
    generator = torch.Generator().manual_seed(seed)
    taps = torch.randn(2, 12, 3 * head.config.target_hidden_size, generator=generator)
    tokens = torch.randint(0, VOCAB, (2, 12), generator=generator)
    hidden, steps, drafted = head.fuse(taps), None, []
    for _ in range(3):
        hidden, steps = head(hidden, tokens, steps)
        drafted.append(target_ids[head.logits(hidden).argmax(-1)])
        tokens = drafted[-1]
    return torch.stack(drafted)


def test_the_widened_head_drafts_the_reduced_heads_greedy_tokens(tmp_path: Path) -> None:
    target = save_target(tmp_path / "target")
    reduced = tiny_head(VOCAB, draft_vocab_size=40, scale=0.5, seed=3)
    write_checkpoint(reduced, tmp_path / "head")
    prepared = prepare_draft(tmp_path / "head", target, tmp_path / "nxdi-head")
    assert (prepared.draft_vocab_size, prepared.vocab_size, prepared.embedding) == (40, VOCAB, "the target's")

    wide = read_checkpoint(tmp_path / "nxdi-head")  # the one reader reads NxDI's names too
    assert wide.config.draft_vocab_size == VOCAB and "d2t" not in wide.tensors
    embedding = load_file(str(target / "model.safetensors"))["model.embed_tokens.weight"]
    assert torch.equal(wide.tensors["embed_tokens.weight"], embedding)
    narrow_head = EagleHead.from_checkpoint(reduced, embedding)
    wide_head = EagleHead.from_checkpoint(wide)
    for seed in range(4):
        narrow = greedy_drafts(narrow_head, reduced.target_ids, seed)
        assert torch.equal(greedy_drafts(wide_head, torch.arange(VOCAB), seed), narrow)
    assert set(reduced.target_ids.tolist()) >= set(narrow.flatten().tolist())  # drafts stay in the draft vocabulary


def test_nxdi_names_and_config(tmp_path: Path) -> None:
    target = save_target(tmp_path / "target")
    write_checkpoint(tiny_head(VOCAB, draft_vocab_size=40, taps=(2, 1, 0)), tmp_path / "head")
    prepare_draft(tmp_path / "head", target, tmp_path / "out", torch.bfloat16)
    names = set(load_file(str(tmp_path / "out" / "model.safetensors")))
    assert "layers.0.hidden_norm.weight" in names and not any(n.startswith("midlayer.") for n in names)
    assert {"fc.weight", "norm.weight", "lm_head.weight", "embed_tokens.weight"} <= names
    assert not names & {"d2t", "t2d"}
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert (config["vocab_size"], config["draft_vocab_size"], config["torch_dtype"]) == (VOCAB, VOCAB, "bfloat16")
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 1, 0]


def test_out_of_vocabulary_rows_never_win() -> None:
    """The mean row's logit is the mean of the draft logits: below their maximum unless all are equal."""
    generator = torch.Generator().manual_seed(0)
    lm_head, ids = torch.randn(5, 8, generator=generator), torch.tensor([1, 4, 6, 7, 9])
    wide = widen_lm_head(lm_head, ids, 12)
    hidden = torch.randn(1000, 8, generator=generator)
    assert torch.equal(ids[(hidden @ lm_head.T).argmax(-1)], (hidden @ wide.T).argmax(-1))


def test_a_head_for_another_target_is_refused(tmp_path: Path) -> None:
    target = save_target(tmp_path / "target", vocab=64)
    write_checkpoint(tiny_head(VOCAB, draft_vocab_size=40), tmp_path / "head")
    with pytest.raises(UsageError) as refused:
        prepare_draft(tmp_path / "head", target, tmp_path / "out")
    (problem,) = refused.value.problems
    assert problem.field == "--target" and "vocabulary" in problem.rule
    assert not (tmp_path / "out").exists()


def test_cli(tmp_path: Path) -> None:
    from click.testing import CliRunner

    target = save_target(tmp_path / "target")
    write_checkpoint(tiny_head(VOCAB, draft_vocab_size=40), tmp_path / "head")
    args = ["prepare-draft", str(tmp_path / "head"), "--target", str(target), "--out", str(tmp_path / "out")]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "widened from 40 to 97" in result.output
    assert "read by NxD Inference, vLLM, neuron-ssp; not by SGLang or SafeAILab/EAGLE" in result.output
    assert f"give them the original head {tmp_path / 'head'}" in result.output
    missing = CliRunner().invoke(main, ["prepare-draft", str(tmp_path / "nope"), "--target", str(target), "--out", "x"])
    assert missing.exit_code == 2 and "directory does not exist" in missing.output


@pytest.mark.slow
def test_the_embedded_head_goes_through_the_same_reader(tmp_path: Path) -> None:
    """`prepare-draft embedded:smollm2-135m-instruct-eagle3` reads the shipped head with the reader every head goes
    through; while none ships, it says so (embedded/heads.py)."""
    from click.testing import CliRunner

    from neuron_ssp.config import EMBEDDED_DEFAULT, EMBEDDED_EAGLE3
    from neuron_ssp.embedded.heads import EMBEDDED_HEADS

    out = tmp_path / "out"
    args = ["prepare-draft", EMBEDDED_EAGLE3, "--target", EMBEDDED_DEFAULT, "--out", str(out)]
    result = CliRunner().invoke(main, args)
    if (EMBEDDED_HEADS[EMBEDDED_EAGLE3][0] / "config.json").is_file():
        assert result.exit_code == 0, result.output
        assert read_checkpoint(out).config.draft_vocab_size == 49152
    else:
        assert result.exit_code == 1 and "ships no EAGLE-3 head" in result.output
