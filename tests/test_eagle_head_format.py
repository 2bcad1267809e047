"""Our EAGLE-3 checkpoints as three other loaders read them: a small random head written by our writer
(drafters/eagle_checkpoint.py `write_checkpoint`) and the same head after `prepare-draft`.

Each loader's rules are re-stated here from reading its source, not copied from it:
- vLLM, vllm/model_executor/models/llama_eagle3.py at 00bd1493 (`Eagle3LlamaForCausalLM` and `LlamaModel`: their
  parameters, `load_weights` and `compute_logits`);
- SafeAILab/EAGLE at 148042c5: the head's modules (eagle/model/cnets.py:475-538), the draft vocabulary
  (eagle/traineagle3/cnets.py:671-674) and the load (eagle/model/ea_model.py:74-76, `load_state_dict(strict=False)`);
- SGLang, python/sglang/srt/models/llama_eagle3.py at 03d5a777 (`LlamaForCausalLMEagle3`: its parameters and
  `load_weights`).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from eagle_support import tiny_head
from safetensors.torch import load_file
from test_prepare_draft import VOCAB, save_target

from neuron_ssp.drafters.eagle_checkpoint import EagleCheckpoint, read_checkpoint, write_checkpoint
from neuron_ssp.tools.prepare_draft import NOT_READ_BY, READ_BY, prepare_draft
from neuron_ssp.topology.head_config import EagleConfig

DRAFT_VOCAB = 40
STACKED = {  # vLLM's and SGLang's stacked_params_mapping: (checkpoint name part, parameter name part, shard)
    ".q_proj": (".qkv_proj", 0),
    ".k_proj": (".qkv_proj", 1),
    ".v_proj": (".qkv_proj", 2),
    ".gate_proj": (".gate_up_proj", 0),
    ".up_proj": (".gate_up_proj", 1),
}


def layer_parameters(config: EagleConfig, prefix: str, stacked: bool) -> dict[str, tuple[int, ...]]:
    """The decoder layer's parameters: q/k/v reading [embedding; hidden] (2H), its three norms and the MLP."""
    h, hd, inter = config.hidden_size, config.head_dim, config.intermediate_size
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    attention = (
        {"self_attn.qkv_proj.weight": ((heads + 2 * kv) * hd, 2 * h)}
        if stacked
        else {
            "self_attn.q_proj.weight": (heads * hd, 2 * h),
            "self_attn.k_proj.weight": (kv * hd, 2 * h),
            "self_attn.v_proj.weight": (kv * hd, 2 * h),
        }
    )
    mlp = (
        {"mlp.gate_up_proj.weight": (2 * inter, h)}
        if stacked
        else {"mlp.gate_proj.weight": (inter, h), "mlp.up_proj.weight": (inter, h)}
    )
    rest = {
        "self_attn.o_proj.weight": (h, heads * hd),
        "mlp.down_proj.weight": (h, inter),
        "input_layernorm.weight": (h,),
        "post_attention_layernorm.weight": (h,),
        "hidden_norm.weight": (h,),
    }
    return {prefix + name: shape for name, shape in {**attention, **mlp, **rest}.items()}


def around_layer(config: EagleConfig, model: str) -> dict[str, tuple[int, ...]]:
    """embed_tokens (V x H), fc (H x 3 target_hidden_size, or 3H without it), norm under `model`; lm_head over the
    draft vocabulary beside it."""
    h = config.hidden_size
    return {
        f"{model}embed_tokens.weight": (config.vocab_size, h),
        f"{model}fc.weight": (h, 3 * config.target_hidden_size),
        f"{model}norm.weight": (h,),
        "lm_head.weight": (config.draft_vocab_size, h),
    }


# ---------------------------------------------------------------- vLLM


def vllm_parameters(config: EagleConfig) -> dict[str, tuple[int, ...]]:
    """Eagle3LlamaForCausalLM's parameters: the LlamaModel under `model.` (its one layer `layers.0`, q/k/v stacked
    into qkv_proj with 2H inputs for layer 0, gate/up into gate_up_proj), lm_head (draft_vocab_size x H) and
    draft_id_to_target_id (draft_vocab_size, int64)."""
    return {
        **around_layer(config, "model."),
        **layer_parameters(config, "model.layers.0.", stacked=True),
        "draft_id_to_target_id": (config.draft_vocab_size,),
    }


def vllm_load(tensors: dict[str, torch.Tensor], config: EagleConfig) -> dict[str, torch.Tensor]:
    """vLLM's load_weights on checkpoint tensors: names with `t2d` skipped; `d2t` becomes draft_id_to_target_id;
    every other name but lm_head's goes under `model.`, where `midlayer.` is `layers.0.` and q/k/v and gate/up
    fill their stacked parameter's shards. An unknown name is a KeyError (params_dict[name]); embed_tokens and
    draft_id_to_target_id may be absent (skipped when the checkpoint has none)."""
    known = vllm_parameters(config)
    shards: dict[str, dict[int, torch.Tensor]] = {}
    loaded: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        if "t2d" in name:
            continue
        if "d2t" in name:
            name = name.replace("d2t", "draft_id_to_target_id")
        elif "lm_head" not in name:
            name = "model." + name.replace("midlayer.", "layers.0.")
        stacked = next(((part, param) for part, param in STACKED.items() if part in name), None)
        if stacked is not None:
            part, (param, shard) = stacked
            name = name.replace(part, param)
            shards.setdefault(name, {})[shard] = tensor
        if name not in known:
            raise KeyError(name)
        loaded[name] = tensor
    for name, parts in shards.items():
        loaded[name] = torch.cat([parts[i] for i in sorted(parts)])
    return loaded


def vllm_logits(draft_logits: torch.Tensor, draft_id_to_target_id: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """compute_logits: the draft logits at target ids arange(draft_vocab) + draft_id_to_target_id, -inf elsewhere."""
    targets = torch.arange(draft_logits.shape[-1]) + draft_id_to_target_id
    full = draft_logits.new_full((draft_logits.shape[0], vocab_size), float("-inf"))
    full[:, targets] = draft_logits
    return full


# ---------------------------------------------------------------- SafeAILab/EAGLE


def safeailab_state(config: EagleConfig) -> dict[str, tuple[int, ...]]:
    """Model's state dict (cnets.py:475-538): embed_tokens, lm_head (H -> draft_vocab_size), `midlayer` (a
    LlamaDecoderLayeremb: q/k/v read 2H, :191-215, :384-396), fc (3 target_hidden_size, or 3H, -> H), norm, and the
    buffers d2t (draft_vocab_size, int64) and t2d (vocab_size, bool)."""
    return {
        **around_layer(config, ""),
        **layer_parameters(config, "midlayer.", stacked=False),
        "d2t": (config.draft_vocab_size,),
        "t2d": (config.vocab_size,),
    }


def safeailab_load(tensors: dict[str, torch.Tensor], config: EagleConfig) -> tuple[set[str], set[str]]:
    """ea_model.py:74-76: d2t and t2d deleted from the module when the vocabularies are equal, then
    load_state_dict(strict=False): (missing keys, unexpected keys), neither an error."""
    expected = safeailab_state(config)
    if config.draft_vocab_size == config.vocab_size:
        del expected["d2t"], expected["t2d"]
    return set(expected) - set(tensors), set(tensors) - set(expected)


# ---------------------------------------------------------------- SGLang


def sglang_parameters(config: EagleConfig) -> dict[str, tuple[int, ...]]:
    """LlamaForCausalLMEagle3's parameters: the LlamaModel under `model.` with its layer as `midlayer` (q/k/v and
    gate/up stacked), lm_head over the draft vocabulary (tie_word_embeddings is false in our config.json)."""
    return {**around_layer(config, "model."), **layer_parameters(config, "model.midlayer.", stacked=True)}


def sglang_load(tensors: dict[str, torch.Tensor], config: EagleConfig) -> tuple[set[str], list[str], torch.Tensor]:
    """load_weights: `d2t` becomes hot_token_id = d2t + arange, `t2d` is skipped, q/k/v and gate/up fill their
    stacked parameter, a name is looked up as is and then under `model.`, and a name found neither way is dropped
    without a word. (loaded parameters, dropped checkpoint names, hot_token_id)."""
    known = sglang_parameters(config)
    loaded, dropped, hot = set(), [], torch.arange(config.draft_vocab_size)
    for name, tensor in tensors.items():
        if "d2t" in name:
            hot = tensor + torch.arange(tensor.shape[0])
            continue
        if "t2d" in name:
            continue
        stacked = next(((part, param) for part, param in STACKED.items() if part in name), None)
        param = name.replace(stacked[0], stacked[1][0]) if stacked else name
        param = param if param in known else f"model.{param}"
        if param in known:
            loaded.add(param)
        else:
            dropped.append(name)
    return loaded, dropped, hot


# ---------------------------------------------------------------- our heads


@pytest.fixture
def written(tmp_path: Path) -> tuple[EagleCheckpoint, dict[str, torch.Tensor], torch.Tensor]:
    """A head over a random 40-token draft vocabulary as our writer writes it: (the head, the tensors in its
    model.safetensors, the target ids the draft vocabulary was built from)."""
    head = tiny_head(VOCAB, draft_vocab_size=DRAFT_VOCAB, seed=11)
    write_checkpoint(head, tmp_path / "head")
    return head, load_file(str(tmp_path / "head" / "model.safetensors")), head.tensors["t2d"].nonzero().view(-1)


def test_vllm_finds_every_tensor_with_its_shape_and_maps_draft_logits_to_our_token_ids(written: tuple) -> None:
    head, tensors, used = written
    loaded = vllm_load(tensors, head.config)
    expected = vllm_parameters(head.config)
    assert set(expected) - set(loaded) == {"model.embed_tokens.weight"}  # absent: the target's is used
    assert {name: tuple(t.shape) for name, t in loaded.items()} == {n: s for n, s in expected.items() if n in loaded}
    assert loaded["draft_id_to_target_id"].dtype == torch.int64
    logits = torch.randn(64, DRAFT_VOCAB, generator=torch.Generator().manual_seed(0))
    full = vllm_logits(logits, loaded["draft_id_to_target_id"], VOCAB)
    assert torch.equal(full.argmax(-1), head.target_ids[logits.argmax(-1)])
    assert torch.equal(torch.isfinite(full[0]).nonzero().view(-1), used)  # only the draft vocabulary, at our ids


def test_safeailab_finds_every_module_and_reads_d2t_as_offsets_t2d_as_a_mask(written: tuple) -> None:
    head, tensors, used = written
    missing, unexpected = safeailab_load(tensors, head.config)
    assert (missing, unexpected) == ({"embed_tokens.weight"}, set())  # SafeAILab loads the target's embedding
    expected = safeailab_state(head.config)
    assert all(tuple(tensors[name].shape) == expected[name] for name in tensors)
    assert tensors["d2t"].dtype == torch.int64 and tensors["t2d"].dtype == torch.bool
    assert torch.equal(tensors["d2t"], used - torch.arange(DRAFT_VOCAB))  # d2t[i] = used[i] - i, used sorted
    assert torch.equal(tensors["t2d"], torch.isin(torch.arange(VOCAB), used))  # t2d[i] = i in used


def test_sglang_finds_every_tensor_under_its_names(written: tuple) -> None:
    head, tensors, _ = written
    loaded, dropped, hot = sglang_load(tensors, head.config)
    assert dropped == []
    assert set(sglang_parameters(head.config)) - loaded == {"model.embed_tokens.weight"}
    assert torch.equal(hot, head.target_ids)


def test_the_prepared_head_is_read_by_nxdi_and_vllm_not_by_sglang_or_safeailab(tmp_path: Path) -> None:
    """prepare-draft writes the layer under NxDI's names (`layers.0.*`): vLLM reads those as it reads `midlayer.*`;
    SGLang and SafeAILab look for `midlayer.*` only and drop the layer without an error, as prepare-draft says."""
    write_checkpoint(tiny_head(VOCAB, draft_vocab_size=DRAFT_VOCAB, seed=11), tmp_path / "head")
    prepare_draft(tmp_path / "head", save_target(tmp_path / "target"), tmp_path / "nxdi")
    tensors = load_file(str(tmp_path / "nxdi" / "model.safetensors"))
    wide = read_checkpoint(tmp_path / "nxdi").config  # over the whole vocabulary
    layer = {name for name in tensors if name.startswith("layers.0.")}
    assert layer == set(layer_parameters(wide, "layers.0.", stacked=False))

    loaded = vllm_load(tensors, wide)
    assert set(vllm_parameters(wide)) - set(loaded) == {"draft_id_to_target_id"}  # none: the identity, zeros

    sglang_loaded, dropped, _ = sglang_load(tensors, wide)
    assert set(dropped) == layer and not any(".midlayer." in name for name in sglang_loaded)

    missing, unexpected = safeailab_load(tensors, wide)
    assert unexpected == layer and missing == set(layer_parameters(wide, "midlayer.", stacked=False))
    assert ("NxD Inference" in READ_BY and "vLLM" in READ_BY) and NOT_READ_BY == ("SGLang", "SafeAILab/EAGLE")
