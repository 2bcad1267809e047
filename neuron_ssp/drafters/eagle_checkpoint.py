"""The standard EAGLE-3 checkpoint: read, check and write it. The one reader in the package.

A head directory holds `config.json` and its weights (`model.safetensors`, a sharded safetensors index, or
SafeAILab's `pytorch_model.bin`), the layout SafeAILab/EAGLE, SpecForge, vLLM and SGLang load:
- config.json: a Llama config of one layer (`hidden_size`, `num_attention_heads`, `num_key_value_heads`,
  `intermediate_size`, `rms_norm_eps`, rope settings), `vocab_size` (the target's), `draft_vocab_size`, optionally
  `target_hidden_size` (the target's width when it differs) and the tap layers as
  `eagle_aux_hidden_state_layer_ids` (vLLM's gpu_model_runner reads it top level first, then under `eagle_config`:
  `_get_eagle3_aux_layers_from_config` at vllm-project/vllm 000fc94b). Without taps the target's layers 2, N//2,
  N-3 are meant (SafeAILab/EAGLE cb7e0841 `eagle/model/modeling_llama_kv.py:1137-1139`; vLLM's default).
- tensors: `fc.weight` (H x 3H_target), `midlayer.*` (one decoder layer whose q/k/v read 2H: [embedding; hidden]),
  `norm.weight`, `lm_head.weight` (draft_vocab x H), `d2t` (draft id -> OFFSET to the target id: target = draft +
  d2t[draft], SafeAILab `eagle/traineagle3/cnets.py:673` and `eagle/model/cnets.py:712`, vLLM
  `llama_eagle3.py` compute_logits at 00bd1493), `t2d` (bool over the target vocabulary), optionally
  `embed_tokens.weight` (SpecForge writes it; otherwise the target's embedding is used). vLLM also accepts
  `layers.0.*` for `midlayer.*` (its load_weights renames midlayer to layers.0); both read here.
  Where draft_vocab_size equals vocab_size, d2t and t2d may be absent (SafeAILab `ea_model.py:74-75`).

Every problem of a checkpoint is reported at once, each naming the file, the tensor (or key), the rule and the fix.
`write_checkpoint` writes the canonical names (`midlayer.*`) and the taps into config.json, so a reader never guesses.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from neuron_ssp.errors import Problem, UsageError
from neuron_ssp.topology.head_config import ARCHITECTURE, TAPS_KEY, EagleConfig, default_taps, parse_config

WEIGHTS_FILE = "model.safetensors"
# tensors a checkpoint may carry that hold nothing the head computes with
IGNORED = ("rotary_emb.inv_freq",)


@dataclass
class EagleCheckpoint:
    """A head: its config and its tensors under the canonical names (`midlayer.*`, `fc.weight`, ...)."""

    config: EagleConfig
    tensors: dict[str, torch.Tensor]

    @property
    def target_ids(self) -> torch.Tensor:
        """(draft_vocab,) int64: the target id of each draft id (draft + d2t[draft]; the identity without d2t)."""
        ids = torch.arange(self.config.draft_vocab_size)
        d2t = self.tensors.get("d2t")
        return ids if d2t is None else ids + d2t.long()


def head_config_for(
    target_config: dict[str, Any], draft_vocab_size: int, taps: Sequence[int] | None = None
) -> EagleConfig:
    """A head as wide as the target (SafeAILab's heads copy the target's config.json, one layer) over a draft
    vocabulary of `draft_vocab_size`, reading `taps` (None: default_taps of the target's layers).
    `target_config`: the target's config.json as a dict (`model.config.to_dict()`)."""
    layers = int(target_config["num_hidden_layers"])
    raw = dict(target_config) | {
        "architectures": [ARCHITECTURE],
        "num_hidden_layers": 1,
        "draft_vocab_size": draft_vocab_size,
        TAPS_KEY: list(taps if taps is not None else default_taps(layers)),
    }
    config, problems = parse_config(raw, "config.json")
    if config is None:
        raise UsageError(problems)
    return config


def vocab_maps(target_ids: torch.Tensor, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(d2t, t2d) for a draft vocabulary of these target ids (each once), in SafeAILab's convention
    (`eagle/traineagle3/cnets.py:671-674`): draft ids follow the sorted target ids, d2t their offsets."""
    ordered = torch.sort(target_ids.long()).values
    d2t = ordered - torch.arange(ordered.shape[0])
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[ordered] = True
    return d2t, t2d


def tensor_shapes(config: EagleConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a head must carry, with its shape (d2t / t2d only with a reduced draft vocabulary)."""
    h, inter, hd = config.hidden_size, config.intermediate_size, config.head_dim
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    shapes = {
        "fc.weight": (h, 3 * config.target_hidden_size),
        "midlayer.hidden_norm.weight": (h,),
        "midlayer.input_layernorm.weight": (h,),
        "midlayer.post_attention_layernorm.weight": (h,),
        "midlayer.self_attn.q_proj.weight": (heads * hd, 2 * h),
        "midlayer.self_attn.k_proj.weight": (kv * hd, 2 * h),
        "midlayer.self_attn.v_proj.weight": (kv * hd, 2 * h),
        "midlayer.self_attn.o_proj.weight": (h, heads * hd),
        "midlayer.mlp.gate_proj.weight": (inter, h),
        "midlayer.mlp.up_proj.weight": (inter, h),
        "midlayer.mlp.down_proj.weight": (h, inter),
        "norm.weight": (h,),
        "lm_head.weight": (config.draft_vocab_size, h),
    }
    if config.draft_vocab_size != config.vocab_size:
        shapes.update({"d2t": (config.draft_vocab_size,), "t2d": (config.vocab_size,)})
    return shapes


OPTIONAL_SHAPES = {"embed_tokens.weight": lambda c: (c.vocab_size, c.hidden_size)}


# ---------------------------------------------------------------- reading


def read_checkpoint(path: str | Path) -> EagleCheckpoint:
    """The head in directory `path`, checked; a UsageError naming every problem otherwise."""
    directory = Path(path)
    config_file = directory / "config.json"
    if not config_file.is_file():
        raise UsageError(
            Problem(
                str(config_file),
                None,
                "an EAGLE-3 head directory holds config.json beside its weights; there is none",
                "point draft.path at the head's directory (config.json + model.safetensors), as SpecForge or "
                "SafeAILab/EAGLE write it",
            )
        )
    config, problems = parse_config(_read_json(config_file), str(config_file))
    if config is None:
        raise UsageError(problems)
    weights_file, tensors = _read_tensors(directory)
    checkpoint = EagleCheckpoint(config, tensors)
    problems += check_tensors(checkpoint, str(weights_file))
    if problems:
        raise UsageError(problems)
    return checkpoint


def _read_json(file: Path) -> dict[str, Any]:
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(
            Problem(str(file), None, f"does not parse as JSON ({exc})", "rewrite config.json as valid JSON")
        ) from None
    if not isinstance(data, dict):
        raise UsageError(Problem(str(file), None, "must hold a JSON object", "rewrite config.json as an object"))
    return data


def _read_tensors(directory: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    """(the weights file, its tensors under canonical names), from safetensors (one file or an index) or
    SafeAILab's pytorch_model.bin."""
    from safetensors.torch import load_file

    single, index, pickle = (
        directory / WEIGHTS_FILE,
        directory / "model.safetensors.index.json",
        directory / "pytorch_model.bin",
    )
    if single.is_file():
        return single, canonical_names(load_file(str(single)))
    if index.is_file():
        shards = sorted(set(_read_json(index).get("weight_map", {}).values()))
        tensors: dict[str, torch.Tensor] = {}
        for shard in shards:
            tensors.update(load_file(str(directory / shard)))
        return index, canonical_names(tensors)
    if pickle.is_file():
        return pickle, canonical_names(torch.load(str(pickle), map_location="cpu", weights_only=True))
    raise UsageError(
        Problem(
            str(single),
            None,
            "no weights beside config.json (model.safetensors, model.safetensors.index.json or pytorch_model.bin)",
            "copy the head's weights into the directory",
        )
    )


def canonical_names(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The tensors under the names this module uses: `layers.0.` is `midlayer.` (vLLM's load_weights renames
    one into the other), a leading `model.` goes, vLLM's `draft_id_to_target_id` is `d2t`."""
    renamed = {}
    for name, tensor in tensors.items():
        canonical = name.removeprefix("model.")
        canonical = (
            "midlayer." + canonical.removeprefix("layers.0.") if canonical.startswith("layers.0.") else canonical
        )
        canonical = "d2t" if canonical == "draft_id_to_target_id" else canonical
        if not canonical.endswith(IGNORED):
            renamed[canonical] = tensor
    return renamed


def check_tensors(checkpoint: EagleCheckpoint, file: str) -> list[Problem]:
    """Every tensor present with its shape and kind, nothing unknown, and d2t / t2d a consistent map."""
    config, tensors = checkpoint.config, checkpoint.tensors
    expected = tensor_shapes(config)
    optional: dict[str, tuple[int, ...]] = {name: shape(config) for name, shape in OPTIONAL_SHAPES.items()}
    problems = []
    for name, shape in expected.items():
        if name not in tensors:
            problems.append(
                Problem(
                    f"{file}:{name}",
                    None,
                    f"missing: an EAGLE-3 head carries {name} of shape {list(shape)}",
                    "export the head with all its tensors (SpecForge's to_hf, SafeAILab's save)",
                )
            )
    for name, tensor in tensors.items():
        wanted = expected.get(name) or optional.get(name)
        if wanted is None:
            problems.append(
                Problem(
                    f"{file}:{name}",
                    list(tensor.shape),
                    "not a tensor of an EAGLE-3 head (one decoder layer `midlayer.*`, fc, norm, lm_head, d2t, t2d, "
                    "embed_tokens)",
                    "remove it, or use a head of the standard EAGLE-3 layout",
                )
            )
        elif tuple(tensor.shape) != wanted:
            problems.append(
                Problem(
                    f"{file}:{name}",
                    list(tensor.shape),
                    f"must have shape {list(wanted)} for the sizes in config.json",
                    "make config.json's sizes match the weights (hidden_size, heads, intermediate_size, "
                    "draft_vocab_size, vocab_size)",
                )
            )
        elif name not in ("d2t", "t2d") and not tensor.is_floating_point():
            problems.append(
                Problem(f"{file}:{name}", str(tensor.dtype), "must be floating point", "store the weights as floats")
            )
    if not problems and "d2t" in tensors:
        problems += _check_vocab_maps(tensors["d2t"], tensors["t2d"], config.vocab_size, file)
    return problems


def _check_vocab_maps(d2t: torch.Tensor, t2d: torch.Tensor, vocab_size: int, file: str) -> list[Problem]:
    """d2t: integer offsets giving distinct target ids in range; t2d: True exactly at those ids."""
    if d2t.is_floating_point() or d2t.dtype == torch.bool:
        return [
            Problem(
                f"{file}:d2t",
                str(d2t.dtype),
                "must hold integer offsets (target id = draft id + d2t[draft id])",
                "store d2t as int64",
            )
        ]
    ids = torch.arange(d2t.shape[0]) + d2t.long()
    problems = []
    if bool((ids < 0).any() or (ids >= vocab_size).any()):
        bad = int(((ids < 0) | (ids >= vocab_size)).nonzero()[0])
        problems.append(
            Problem(
                f"{file}:d2t",
                f"draft id {bad} -> target id {int(ids[bad])}",
                f"draft id + d2t[draft id] must be a target id in [0, {vocab_size}); d2t holds OFFSETS, not ids "
                "(SafeAILab's convention)",
                "store d2t[i] = target_id[i] - i",
            )
        )
    elif torch.unique(ids).shape[0] != ids.shape[0]:
        problems.append(
            Problem(
                f"{file}:d2t",
                "repeated target ids",
                "each draft id must map to a different target id, or a token's draft probability is counted twice",
                "rebuild d2t from the draft vocabulary's distinct target ids (vocab_maps)",
            )
        )
    elif t2d.dtype != torch.bool and not bool(((t2d == 0) | (t2d == 1)).all()):
        problems.append(Problem(f"{file}:t2d", str(t2d.dtype), "must be a boolean mask", "store t2d as bool"))
    else:
        mask = torch.zeros(vocab_size, dtype=torch.bool)
        mask[ids] = True
        if not torch.equal(mask, t2d.bool()):
            problems.append(
                Problem(
                    f"{file}:t2d",
                    f"{int(t2d.bool().sum())} tokens marked",
                    f"must be True exactly at the {ids.shape[0]} target ids d2t maps to",
                    "rebuild t2d from d2t (vocab_maps)",
                )
            )
    return problems


# ---------------------------------------------------------------- writing


def write_checkpoint(checkpoint: EagleCheckpoint, path: str | Path, dtype: torch.dtype | None = None) -> Path:
    """config.json + model.safetensors in `path` (created), canonical names; weights cast to `dtype` when given
    (d2t and t2d keep theirs). Checked before anything is written."""
    from safetensors.torch import save_file

    problems = check_tensors(checkpoint, WEIGHTS_FILE)
    if problems:
        raise UsageError(problems)
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {
        name: (tensor if dtype is None or not tensor.is_floating_point() else tensor.to(dtype)).contiguous()
        for name, tensor in checkpoint.tensors.items()
    }
    tensors = {name: tensor.long() if name == "d2t" else tensor for name, tensor in tensors.items()}
    if "t2d" in tensors:
        tensors["t2d"] = tensors["t2d"].bool()
    save_file(tensors, str(directory / WEIGHTS_FILE))
    config = checkpoint.config.to_dict()
    if dtype is not None:
        config["torch_dtype"] = str(dtype).removeprefix("torch.")
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return directory
