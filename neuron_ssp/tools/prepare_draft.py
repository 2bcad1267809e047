"""`neuron-ssp prepare-draft`: a standard EAGLE-3 head -> the head NxD Inference loads.

NxD Inference runs "EAGLE3 heads with the same hidden size and vocabulary size as the target model ... It must
contain the following layers: fc, hidden_norm, input_layernorm, attention, mlp, lm_head and embed_tokens"
(aws-neuron-sdk 81ce03ae, libraries/nxd-inference/tutorials/trn3-gpt-oss-120b-tutorial.rst:91-93), and it has no
d2t / t2d. A standard checkpoint (SafeAILab, SpecForge, vLLM: read by drafters/eagle_checkpoint.py, the one
reader) carries neither the target's embedding nor an lm_head over the whole vocabulary. So:
- `embed_tokens.weight`: the target's embedding, copied in (the head shares it, frozen), unless the head has one;
- `lm_head.weight`: widened from draft_vocab x H to vocab x H. Row t of a draft token keeps its row (t = draft id
  + d2t); every other row is the mean of the head's rows, whose logit is the mean of the draft logits, below their
  maximum unless they are all equal. NxDI drafts greedily (the fused model forces its draft greedy,
  model_base.py:1633-1636 at 4bcdc54b), so the widened head drafts the reduced head's tokens, and the target
  verifies every one of them: the output is the target's either way;
- the decoder layer under NxDI's names, `layers.0.*` (its Llama model has `layers`; only the padded-hidden path
  renames `midlayer`, modeling_llama.py:1284), d2t / t2d dropped, config.json's draft_vocab_size = vocab_size.
Who reads the result (tests/test_eagle_head_format.py holds each loader's naming rules against it): NxD Inference;
vLLM, whose load_weights renames `midlayer.` to `layers.0.` and so takes either (llama_eagle3.py at 00bd1493); and
neuron-ssp's own reader. SGLang looks for the layer as `midlayer.*` only and drops a name it does not know without a
word (llama_eagle3.py `load_weights` at 03d5a777), and SafeAILab/EAGLE loads with load_state_dict(strict=False)
(eagle/model/ea_model.py:76 at 148042c5): both would run the prepared head with a random layer. Serve the original
head there; it is the standard checkpoint.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from neuron_ssp.drafters.eagle_checkpoint import (
    WEIGHTS_FILE,
    EagleCheckpoint,
    EagleConfig,
    check_tensors,
    read_checkpoint,
)
from neuron_ssp.errors import Problem, UsageError

NXDI_LAYER = "layers.0."
READ_BY = ("NxD Inference", "vLLM", "neuron-ssp")
NOT_READ_BY = ("SGLang", "SafeAILab/EAGLE")  # they read the layer as midlayer.* only and drop layers.0.* silently


@dataclass(frozen=True)
class PreparedHead:
    directory: Path
    draft_vocab_size: int  # of the head as given
    vocab_size: int
    embedding: str  # where embed_tokens.weight came from


def widen_lm_head(lm_head: torch.Tensor, target_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """(vocab, H): the head's rows at their target ids, the mean of its rows everywhere else."""
    wide = lm_head.mean(0, keepdim=True).expand(vocab_size, -1).clone()
    wide[target_ids] = lm_head
    return wide


def target_tensors(target_dir: Path) -> dict[str, torch.Tensor]:
    """The target's `embed_tokens.weight` and `lm_head.weight` (its embedding where they are tied), read from its
    safetensors (one file or an index) as NxDI's feature guide does (feature-guide.rst:683-710)."""
    from safetensors import safe_open

    wanted = {"model.embed_tokens.weight": "embed_tokens.weight", "lm_head.weight": "lm_head.weight"}
    index = target_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        files = {name: target_dir / weight_map[name] for name in wanted if name in weight_map}
    else:
        files = dict.fromkeys(wanted, target_dir / WEIGHTS_FILE)
    found: dict[str, torch.Tensor] = {}
    for name, file in files.items():
        if file.is_file():
            with safe_open(str(file), framework="pt") as weights:
                if name in weights.keys():  # noqa: SIM118 (safe_open has keys(), not __contains__)
                    found[wanted[name]] = weights.get_tensor(name)
    if "embed_tokens.weight" not in found:
        raise UsageError(
            Problem(
                "--target",
                str(target_dir),
                "no model.embed_tokens.weight in the target's safetensors (model.safetensors or its index)",
                "pass the target model's Hugging Face directory",
            )
        )
    found.setdefault("lm_head.weight", found["embed_tokens.weight"])  # tied embeddings
    return found


def widened_checkpoint(head: EagleCheckpoint, target: dict[str, torch.Tensor]) -> tuple[EagleCheckpoint, str]:
    """The head over the whole vocabulary with the target's embedding: (checkpoint, where the embedding came from)."""
    config = head.config
    problems = []
    if target["embed_tokens.weight"].shape != (config.vocab_size, config.hidden_size):
        problems.append(
            Problem(
                "--target",
                list(target["embed_tokens.weight"].shape),
                f"the target's embedding must be vocab_size x hidden_size of the head ({config.vocab_size} x "
                f"{config.hidden_size}); NxD Inference runs heads of the target's width and vocabulary only",
                "pass the target the head was trained for",
            )
        )
    if problems:
        raise UsageError(problems)
    tensors = {name: t for name, t in head.tensors.items() if name not in ("d2t", "t2d")}
    tensors["lm_head.weight"] = widen_lm_head(head.tensors["lm_head.weight"], head.target_ids, config.vocab_size)
    source = "the head's own"
    if "embed_tokens.weight" not in tensors:
        tensors["embed_tokens.weight"] = target["embed_tokens.weight"].to(tensors["fc.weight"].dtype)
        source = "the target's"
    wide: EagleConfig = replace(config, draft_vocab_size=config.vocab_size)
    return EagleCheckpoint(wide, tensors), source


def write_nxdi_head(checkpoint: EagleCheckpoint, out: Path, dtype: torch.dtype | None) -> None:
    """config.json + model.safetensors under NxDI's names (`layers.0.*`), checked before anything is written."""
    from safetensors.torch import save_file

    problems = check_tensors(checkpoint, WEIGHTS_FILE)
    if problems:
        raise UsageError(problems)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {
        (NXDI_LAYER + name.removeprefix("midlayer.") if name.startswith("midlayer.") else name): (
            tensor.to(dtype) if dtype is not None else tensor
        ).contiguous()
        for name, tensor in checkpoint.tensors.items()
    }
    save_file(tensors, str(out / WEIGHTS_FILE))
    config = checkpoint.config.to_dict()
    if dtype is not None:
        config["torch_dtype"] = str(dtype).removeprefix("torch.")
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def prepare_draft(head_dir: Path, target_dir: Path, out: Path, dtype: torch.dtype | None = None) -> PreparedHead:
    """Read the head (eagle_checkpoint), widen it over the target's vocabulary with its embedding, write it for NxDI."""
    if out.resolve() == head_dir.resolve():
        raise UsageError(
            Problem(
                "--out", str(out), "would overwrite the head it reads", "write the prepared head to a new directory"
            )
        )
    head = read_checkpoint(head_dir)
    wide, source = widened_checkpoint(head, target_tensors(target_dir))
    write_nxdi_head(wide, out, dtype)
    return PreparedHead(out, head.config.draft_vocab_size, head.config.vocab_size, source)
