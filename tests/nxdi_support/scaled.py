"""A shipped NxDI config scaled down to run on CPU at tp = 2: the same instance (so the same LNC), engine,
drafter, k, batch and `neuron.nxdi` switches, each model replaced by random weights of its shape scaled down.

The scaling keeps what decides how NxDI shards a model (tests/test_nxdi_shipped_tp2.py):
- attention heads per rank: 2 * heads / tp heads at tp 2, so a model whose heads do not divide its tp is padded
  here too (Llama-3.2-1B's 32 heads at tp 64 -> 1 head at tp 2), and KV heads fewer than the ranks are replicated
  (8 KV heads at tp 32 -> 1 at tp 2);
- layers / 10 (at least 2; an EAGLE-3 target at least 8, so NxDI's taps 1, N/2-1 and N-4 are distinct layers,
  model_base.py:1402-1405), head_dim 16, a 128-token vocabulary, Llama-3.2-1B's tied embedding;
- positions, buckets and prompt length / 64, and as many new tokens as the room rule leaves.
fp32 replaces bf16: NxDI refuses bfloat16 on CPU at tp > 1 (application_base.py:563-566). The NKI kernel
switches are turned off: the kernels are compiled Neuron code, stubbed on CPU (the QKV kernel's call returns a stub,
gqa.py:631), so what they do needs a device; fused QKV, which is plain torch, stays as shipped.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from transformers import LlamaConfig, LlamaForCausalLM

from neuron_ssp.config import Config, ModelConfig, config_from_dict
from neuron_ssp.topology.models import Architecture, resolve_architecture

TP = 2
HEAD_DIM = 16
VOCAB = 128
POSITION_SCALE = 64
EAGLE3_MIN_LAYERS = 8
NKI_KERNELS = ("qkv_kernel_enabled", "attn_kernel_enabled", "mlp_kernel_enabled")


@dataclass(frozen=True)
class ScaledShape:
    layers: int
    heads: int
    kv_heads: int
    tied: bool

    @property
    def hidden(self) -> int:
        return self.heads * HEAD_DIM


def scaled_shape(real: Architecture, tp: int, min_layers: int = 2) -> ScaledShape:
    heads = max(1, round(TP * real.heads / tp))
    kv_heads = max(1, round(TP * real.kv_heads / tp))
    assert (heads % TP == 0) == (real.heads % tp == 0), f"{real.name} at tp {tp}: padding not kept by {heads} heads"
    assert (kv_heads < TP) == (real.kv_heads < tp), f"{real.name} at tp {tp}: KV replication not kept"
    assert heads % kv_heads == 0, f"{real.name}: {heads} heads over {kv_heads} KV heads"
    return ScaledShape(max(min_layers, real.layers // 10), heads, kv_heads, real.name == "llama-3.2-1b")


def save_scaled(directory: Path, shape: ScaledShape, seed: int) -> Path:
    import torch

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=shape.hidden,
        intermediate_size=2 * shape.hidden,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        head_dim=HEAD_DIM,
        max_position_embeddings=256,
        rope_theta=500000.0,
        tie_word_embeddings=shape.tied,
        bos_token_id=1,
        eos_token_id=2,
    )
    LlamaForCausalLM(config).eval().save_pretrained(directory)
    return directory


def eagle3_taps(layers: int) -> tuple[int, int, int]:
    """The head's `eagle_aux_hidden_state_layer_ids` (Hugging Face hidden-state numbering) for NxDI's taps, the
    outputs of layers 1, N/2-1 and N-4 (model_base.py:1402-1405)."""
    return (2, layers // 2, layers - 3)


@dataclass(frozen=True)
class ScaledCase:
    """One shipped config, scaled: its config data and the tiny models it names."""

    name: str
    data: dict[str, Any]
    target: Path
    draft: Path | None

    def config(self) -> Config:
        return config_from_dict(self.data, self.name)


def scaled_case(path: Path, root: Path) -> ScaledCase:
    """The scaled copy of the shipped config at `path`, its models written under `root`."""
    from eagle_support import tiny_head

    from neuron_ssp.drafters.eagle_checkpoint import write_checkpoint
    from neuron_ssp.tools.prepare_draft import prepare_draft

    data = yaml.safe_load(path.read_text())
    shipped = config_from_dict(data, path.name)
    eagle3 = shipped.speculation.drafter == "eagle3"
    target_shape = scaled_shape(
        resolve_architecture(shipped.target, "target"),
        shipped.target.tp_degree,
        EAGLE3_MIN_LAYERS if eagle3 else 2,
    )
    target = save_scaled(root / "target", target_shape, seed=0)
    draft = None
    if eagle3:
        head = tiny_head(VOCAB, draft_vocab_size=40, taps=eagle3_taps(target_shape.layers), hidden=target_shape.hidden)
        write_checkpoint(head, root / "eagle3-head")
        draft = prepare_draft(root / "eagle3-head", target, root / "draft").directory
    elif shipped.draft is not None:
        draft_real = resolve_architecture(shipped.draft, "draft")
        draft = save_scaled(root / "draft", scaled_shape(draft_real, shipped.draft.tp_degree), seed=1)
    for role, directory in (("target", target), ("draft", draft)):
        if directory is not None:
            data[role] = _scaled_model(data[role], directory)
    neuron = data["neuron"]
    neuron.pop("compiled_dir", None)
    neuron["self_test"] = False
    nxdi = neuron.setdefault("nxdi", {})
    nxdi.update(dict.fromkeys(NKI_KERNELS, False))
    for buckets in ("context_encoding_buckets", "token_generation_buckets"):
        if buckets in nxdi:
            nxdi[buckets] = [length // POSITION_SCALE for length in nxdi[buckets]]
    generation = data["generation"]
    generation["max_prompt_tokens"] //= POSITION_SCALE
    room = data["target"]["n_positions"] - generation["max_prompt_tokens"] - shipped.speculation.k + 2
    generation["max_new_tokens"] = min(generation["max_new_tokens"], room)
    return ScaledCase(path.name, data, target, draft)


def _scaled_model(section: dict[str, Any], directory: Path) -> dict[str, Any]:
    return {
        **section,
        "path": str(directory),
        "tp_degree": TP,
        "dtype": "fp32",
        "n_positions": ModelConfig(**section).n_positions // POSITION_SCALE,
    }
