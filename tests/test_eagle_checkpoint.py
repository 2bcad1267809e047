"""The EAGLE-3 checkpoint reader and writer: round trip, other writers' layouts, and malformed heads refused with
every problem named (file, tensor, rule, fix)."""

from __future__ import annotations

import json

import pytest
import torch
from eagle_support import tiny_head
from safetensors.torch import save_file

from neuron_ssp.drafters.eagle_checkpoint import (
    default_taps,
    read_checkpoint,
    tensor_shapes,
    vocab_maps,
    write_checkpoint,
)
from neuron_ssp.errors import UsageError


def test_round_trip_keeps_every_tensor_and_the_taps(tmp_path):
    head = tiny_head()
    write_checkpoint(head, tmp_path / "head")
    back = read_checkpoint(tmp_path / "head")
    assert back.config == head.config and back.config.taps == (0, 1, 2)
    assert set(back.tensors) == set(head.tensors)
    for name, tensor in head.tensors.items():
        assert torch.equal(back.tensors[name], tensor), name
    assert torch.equal(back.target_ids, head.target_ids)
    written = json.loads((tmp_path / "head" / "config.json").read_text())
    assert written["architectures"] == ["LlamaForCausalLMEagle3"] and written["eagle_aux_hidden_state_layer_ids"] == [
        0,
        1,
        2,
    ]


def test_fp16_write_casts_the_weights_and_keeps_the_maps(tmp_path):
    head = tiny_head()
    write_checkpoint(head, tmp_path, dtype=torch.float16)
    back = read_checkpoint(tmp_path)
    assert back.tensors["fc.weight"].dtype == torch.float16 and back.tensors["d2t"].dtype == torch.int64
    assert torch.allclose(back.tensors["fc.weight"].float(), head.tensors["fc.weight"], atol=1e-3)
    assert torch.equal(back.tensors["t2d"], head.tensors["t2d"])


def test_vocab_maps_follow_safeailab(tmp_path):
    """SafeAILab (traineagle3/cnets.py:671-674): draft ids follow the sorted target ids; d2t[i] = id[i] - i."""
    d2t, t2d = vocab_maps(torch.tensor([7, 2, 5]), 10)
    assert d2t.tolist() == [2, 4, 5] and t2d.nonzero().view(-1).tolist() == [2, 5, 7]
    assert default_taps(30) == (2, 15, 27)  # SmolLM2-135M: 30 layers


def test_vllm_naming_layers0_and_taps_under_eagle_config_load(tmp_path):
    """vLLM's load_weights renames midlayer.* to layers.0.* and reads taps top level or under eagle_config."""
    head = tiny_head(taps=None)
    renamed = {name.replace("midlayer.", "layers.0."): tensor for name, tensor in head.tensors.items()}
    save_file(renamed, str(tmp_path / "model.safetensors"))
    config = head.config.to_dict() | {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 0, 2]}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    back = read_checkpoint(tmp_path)
    assert back.config.taps == (1, 0, 2)
    assert torch.equal(back.tensors["midlayer.mlp.down_proj.weight"], head.tensors["midlayer.mlp.down_proj.weight"])


def test_specforge_layout_with_embedding_and_no_taps_loads(tmp_path):
    """SpecForge's to_hf writes embed_tokens.weight beside midlayer.*, d2t, t2d (specforge/export/to_hf.py)."""
    head = tiny_head(taps=None)
    tensors = dict(head.tensors) | {"embed_tokens.weight": torch.randn(97, 32)}
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(head.config.to_dict()))
    back = read_checkpoint(tmp_path)
    assert back.config.taps is None and "embed_tokens.weight" in back.tensors


def test_safeailab_pytorch_model_bin_loads(tmp_path):
    head = tiny_head()
    torch.save(head.tensors, tmp_path / "pytorch_model.bin")
    (tmp_path / "config.json").write_text(json.dumps(head.config.to_dict()))
    assert torch.equal(read_checkpoint(tmp_path).tensors["lm_head.weight"], head.tensors["lm_head.weight"])


def test_full_vocabulary_head_needs_no_maps(tmp_path):
    head = tiny_head(draft_vocab_size=97)
    assert "d2t" not in tensor_shapes(head.config)
    write_checkpoint(head, tmp_path)
    assert torch.equal(read_checkpoint(tmp_path).target_ids, torch.arange(97))


def problems_of(tmp_path, tensors, config) -> dict[str, object]:
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(UsageError) as err:
        read_checkpoint(tmp_path)
    return {problem.field.split(":")[-1]: problem for problem in err.value.problems}


def test_malformed_tensors_are_refused_all_at_once_naming_file_and_tensor(tmp_path):
    head = tiny_head()
    tensors = dict(head.tensors)
    tensors["fc.weight"] = torch.zeros(32, 64)  # 2 taps' worth
    del tensors["norm.weight"]
    tensors["midlayer.extra.weight"] = torch.zeros(3)
    found = problems_of(tmp_path, tensors, head.config.to_dict())
    assert set(found) == {"fc.weight", "norm.weight", "midlayer.extra.weight"}
    fc = found["fc.weight"]
    assert fc.field == f"{tmp_path / 'model.safetensors'}:fc.weight" and fc.value == [32, 64]
    assert "[32, 96]" in fc.rule and "config.json" in fc.fix
    assert "missing" in found["norm.weight"].rule


def test_d2t_holding_target_ids_instead_of_offsets_is_refused(tmp_path):
    head = tiny_head()
    tensors = dict(head.tensors)
    tensors["d2t"] = head.target_ids + 60  # absolute ids plus an offset: some land past the vocabulary
    problem = problems_of(tmp_path, tensors, head.config.to_dict())["d2t"]
    assert "OFFSETS" in problem.rule and "target_id[i] - i" in problem.fix


def test_d2t_mapping_two_draft_ids_to_one_target_id_is_refused(tmp_path):
    head = tiny_head()
    tensors = dict(head.tensors)
    d2t = tensors["d2t"].clone()
    d2t[1] = int(head.target_ids[0]) - 1  # draft id 1 -> the target id of draft id 0
    tensors["d2t"] = d2t
    assert "different target id" in problems_of(tmp_path, tensors, head.config.to_dict())["d2t"].rule


def test_t2d_disagreeing_with_d2t_is_refused(tmp_path):
    head = tiny_head()
    tensors = dict(head.tensors)
    tensors["t2d"] = ~head.tensors["t2d"]
    assert "exactly at the 40 target ids" in problems_of(tmp_path, tensors, head.config.to_dict())["t2d"].rule


def test_unsupported_config_variants_are_refused_with_the_key(tmp_path):
    head = tiny_head()
    config = head.config.to_dict() | {
        "num_hidden_layers": 2,
        "fc_norm": True,
        "eagle_aux_hidden_state_layer_ids": [1, 1, 2],
    }
    found = problems_of(tmp_path, dict(head.tensors), config)
    assert {"num_hidden_layers", "fc_norm", "eagle_aux_hidden_state_layer_ids"} <= set(found)
    assert found["num_hidden_layers"].field.endswith("config.json:num_hidden_layers")


def test_a_directory_without_config_or_weights_says_what_is_missing(tmp_path):
    with pytest.raises(UsageError, match="config.json"):
        read_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(tiny_head().config.to_dict()))
    with pytest.raises(UsageError, match="no weights beside config.json"):
        read_checkpoint(tmp_path)
