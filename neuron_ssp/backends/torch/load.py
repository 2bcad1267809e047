"""Config -> torch backends: the target (and the draft for drafter 'model') on CPU or CUDA.

The embedded model is checked against its known answer at every load (one forward pass), so a wrong
conversion stops here instead of generating garbage. draft = target shares the weights.
"""

from __future__ import annotations

from pathlib import Path

import torch
import transformers
from packaging.version import Version
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from neuron_ssp.backends.torch.scoring import TorchBackend
from neuron_ssp.config import EMBEDDED_PREFIX, Config, ModelConfig
from neuron_ssp.embedded.models import check_embedded_answer, resolve_model_path

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def dtype_kwarg() -> str:
    """`dtype` since transformers 4.56; DLAMI's 4.4x only knows `torch_dtype`."""
    return "dtype" if Version(transformers.__version__) >= Version("4.56") else "torch_dtype"


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def load_hf_model(path: Path, dtype: str, device: torch.device) -> PreTrainedModel:
    model = AutoModelForCausalLM.from_pretrained(str(path), **{dtype_kwarg(): TORCH_DTYPES[dtype]})
    return model.to(device).eval()


def load_torch_backends(config: Config) -> tuple[TorchBackend, TorchBackend | None, PreTrainedTokenizerBase]:
    """(target, draft, tokenizer); the draft is None unless `speculation.drafter` is 'model'."""
    device = resolve_device(config.platform.device)
    target_dir = resolve_model_path(config.target.path, "target.path")
    draft_cfg = config.draft if config.speculation.drafter == "model" else None
    draft_dir = resolve_model_path(draft_cfg.path, "draft.path") if draft_cfg else None
    tokenizer = AutoTokenizer.from_pretrained(str(target_dir))
    target_model = load_hf_model(target_dir, config.target.dtype, device)
    _check_if_embedded(target_model, tokenizer, config.target.path, "target.path")
    platform = config.platform
    target = TorchBackend(target_model, config.target.n_positions, "target", platform.forward, platform.compile)
    draft = None
    if draft_cfg is not None and draft_dir is not None:
        same = _same_model(target_dir, draft_dir, config.target, draft_cfg)
        draft_model = target_model if same else load_hf_model(draft_dir, draft_cfg.dtype, device)
        if not same:
            _check_if_embedded(draft_model, tokenizer, draft_cfg.path, "draft.path")
        draft = TorchBackend(draft_model, draft_cfg.n_positions, "draft", platform.forward, platform.compile)
    return target, draft, tokenizer


def _check_if_embedded(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, path: str, field: str) -> None:
    """The embedded model's known answer costs one forward pass: cheap enough for every load."""
    if path.startswith(EMBEDDED_PREFIX):
        check_embedded_answer(model, tokenizer, path, field)


def _same_model(target_dir: Path, draft_dir: Path, target: ModelConfig, draft: ModelConfig) -> bool:
    """draft = target shares the weights (two caches, one model) instead of loading twice."""
    return target_dir.resolve() == draft_dir.resolve() and target.dtype == draft.dtype
