"""Config -> torch backends: the target (and the draft for drafter 'model') on CPU or CUDA.

The embedded model is checked against its known answer at every load (one forward pass), so a wrong
conversion stops here instead of generating garbage. draft = target shares the weights. The KV caches
(`slots` sequences each) are checked against the free memory before they are allocated.
"""

from __future__ import annotations

from pathlib import Path

import torch
import transformers
from packaging.version import Version
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from neuron_ssp.backends.neuron.env import host_memory_available
from neuron_ssp.backends.resolve import ModelDirs, resolve_models
from neuron_ssp.backends.torch.block_panels import block_panels
from neuron_ssp.backends.torch.row_kernel import Panels, row_kernel
from neuron_ssp.backends.torch.scoring import ForwardName, TorchBackend, cache_dtype, kv_cache_bytes
from neuron_ssp.config import EMBEDDED_PREFIX, Config, ModelConfig
from neuron_ssp.embedded.models import check_embedded_answer, embedded_gguf
from neuron_ssp.errors import Problem, UsageError

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
KV_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}  # platform.kv_dtype


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


def load_torch_backends(
    config: Config, slots: int = 1, dirs: ModelDirs | None = None
) -> tuple[TorchBackend, TorchBackend | None, PreTrainedTokenizerBase]:
    """(target, draft, tokenizer); the draft is None unless `speculation.drafter` is 'model'. Both caches hold
    `slots` sequences (a request's draft model is its slot of the draft: base.SlotView). `dirs`: the pipeline's
    checked models (checked and resolved here when not given)."""
    device = resolve_device(config.platform.device)
    dirs = dirs or resolve_models(config)
    tokenizer = AutoTokenizer.from_pretrained(str(dirs.target))
    target_model = load_hf_model(dirs.target, config.target.dtype, device)
    _check_if_embedded(target_model, tokenizer, config.target.path, "target.path")
    caches = [(target_model, config.target.n_positions)]
    if dirs.draft is not None and config.draft is not None:
        same = _same_model(dirs.target, dirs.draft, config.target, config.draft)
        draft_model = target_model if same else load_hf_model(dirs.draft, config.draft.dtype, device)
        if not same:
            _check_if_embedded(draft_model, tokenizer, config.draft.path, "draft.path")
        caches.append((draft_model, config.draft.n_positions))
    platform = config.platform
    kv_dtype = KV_DTYPES[platform.kv_dtype]
    check_caches_fit(caches, slots, device, platform.forward, kv_dtype)
    blocks = gguf_blocks(config, config.target, target_model, device)
    target = TorchBackend(
        target_model,
        config.target.n_positions,
        "target",
        platform.forward,
        platform.compile,
        slots=slots,
        prompt_chunk=platform.prefill_chunk,
        kv_dtype=kv_dtype,
        blocks=blocks,
    )
    draft = (
        TorchBackend(
            *caches[1],
            "draft",
            platform.forward,
            platform.compile,
            slots=slots,
            kv_dtype=kv_dtype,
            blocks=gguf_blocks(config, config.draft, caches[1][0], device) if config.draft is not None else None,
        )
        if len(caches) > 1
        else None
    )
    return target, draft, tokenizer


def gguf_blocks(
    config: Config, model_config: ModelConfig, model: PreTrainedModel, device: torch.device
) -> dict[str, Panels] | None:
    """platform.weights auto: the matrices of the GGUF an embedded model comes from, in their quantised blocks
    packed for the row kernel (its fp32 weights are that GGUF's values de-quantised), on a CPU in fp32 where the
    kernel is built; None elsewhere: the fp32 weights serve."""
    if config.platform.weights != "auto" or device.type != "cpu" or model_config.dtype != "fp32":
        return None
    gguf_path, kernel = embedded_gguf(model_config.path), row_kernel()
    if gguf_path is None or kernel is None:
        return None
    text = model.config
    heads = int(text.num_attention_heads)
    kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
    return block_panels(gguf_path, heads, kv_heads, int(text.num_hidden_layers), kernel)


def check_caches_fit(
    caches: list[tuple[PreTrainedModel, int]],
    slots: int,
    device: torch.device,
    forward: ForwardName = "auto",
    kv_dtype: torch.dtype = torch.float32,
) -> None:
    """Refuse KV caches of `slots` sequences (per model: its n_positions; holding what `forward` and `kv_dtype`
    make it hold) larger than the device's free memory (the host's MemAvailable on a CPU), before allocating them;
    where it cannot be read, nothing is checked."""
    needed = sum(
        kv_cache_bytes(model, slots, n_positions, cache_dtype(model, forward, kv_dtype))
        for model, n_positions in caches
    )
    free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else host_memory_available()
    if free is not None and needed > free:
        raise UsageError(
            Problem(
                "serve.max_batch",
                slots,
                f"KV caches of {slots} sequences take {needed / 2**30:.2f} GiB and {device} has {free / 2**30:.2f} GiB "
                "free",
                "lower serve.max_batch, or target.n_positions (and draft.n_positions)",
            )
        )


def _check_if_embedded(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, path: str, field: str) -> None:
    """The embedded model's known answer costs one forward pass: cheap enough for every load."""
    if path.startswith(EMBEDDED_PREFIX):
        check_embedded_answer(model, tokenizer, path, field)


def _same_model(target_dir: Path, draft_dir: Path, target: ModelConfig, draft: ModelConfig) -> bool:
    """draft = target shares the weights (two caches, one model) instead of loading twice."""
    return target_dir.resolve() == draft_dir.resolve() and target.dtype == draft.dtype
