"""GGUF -> safetensors, once, with the fixes transformers 4.4x needs and a known-answer check.

The fixes come from reading transformers' GGUF loader (`modeling_gguf_pytorch_utils.load_gguf_checkpoint`)
and from converting SmolLM2's GGUF under both versions: 5.x sets `tie_word_embeddings` when the GGUF has
no `output.weight`; 4.46 does not, so the Llama head stays randomly initialised and `from_pretrained`
reports it missing. 4.46 also ignores the GGUF's `tokenizer.ggml.add_bos_token = false` (it prepends a
BOS) and makes <|im_start|> the EOS. We tie the head and take BOS and special tokens from the GGUF, so
4.46.3 and 5.x cache identical weights; the saved copy is loaded back and must pass its known answer
before it replaces the cache entry.
"""

from __future__ import annotations

import functools
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import logging as transformers_logging

from neuron_ssp.embedded.cache import first_use_status, write_manifest
from neuron_ssp.embedded.known_answer import KnownAnswer, failure_rule, greedy_answer
from neuron_ssp.errors import Problem, RuntimeProblem

if TYPE_CHECKING:
    from gguf import GGUFReader

SPECIAL_TOKENS = {
    "bos_token": "bos_token_id",
    "eos_token": "eos_token_id",
    "unk_token": "unknown_token_id",
    "pad_token": "padding_token_id",
}  # tokenizer attribute -> GGUF key tokenizer.ggml.<key>


def convert_gguf(gguf_path: Path, target: Path, answer: KnownAnswer, label: str) -> None:
    """De-quantise into a temp dir, check it, then rename: a crash or a wrong model never lands in the cache."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        with first_use_status(f"Converting {gguf_path.name} to safetensors once (~15 s) into {target}"):
            tokenizer, model = dequantise(gguf_path)
            model.save_pretrained(str(staging))
            tokenizer.save_pretrained(str(staging))
            check = greedy_answer(
                AutoModelForCausalLM.from_pretrained(str(staging)).eval(),
                AutoTokenizer.from_pretrained(str(staging)),
                answer,
            )
            if not check.passed:
                raise RuntimeProblem(
                    Problem(
                        label,
                        str(gguf_path),
                        failure_rule(f"the conversion of {gguf_path.name}", check.detail),
                        "use a transformers version CI tests (4.46.3 or 5.x: pip install 'transformers==4.46.3' "
                        "'tokenizers==0.20.3', or a 5.x release) and report this version as a neuron-ssp issue",
                    )
                )
            write_manifest(staging, gguf_path, check.detail)
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def dequantise(gguf_path: Path) -> tuple[PreTrainedTokenizerBase, PreTrainedModel]:
    """The GGUF's tokenizer and a plain (savable) fp32 model with its head tied where the GGUF ties it."""
    directory, name = str(gguf_path.parent), gguf_path.name
    with _gguf_parsed_once(), _tensor_maps_built_once():
        with _quiet_transformers():  # 4.46 warns of the untied head ("newly initialized") and of `legacy`: handled
            tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name)
            quantised, info = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, output_loading_info=True)
        _match_gguf_tokenizer(tokenizer, gguf_path)
    return tokenizer, _tied_plain_copy(quantised, set(info.get("missing_keys", ())))


def _tied_plain_copy(quantised: PreTrainedModel, missing: set[str]) -> PreTrainedModel:
    config = quantised.config.to_dict()
    config.pop("quantization_config", None)  # a GGUF-quantised model refuses save_pretrained
    head = quantised.get_output_embeddings()
    head_keys = {f"{name}.weight" for name, module in quantised.named_modules() if module is head}
    tie = bool(config.get("tie_word_embeddings")) or bool(head_keys & missing)
    config["tie_word_embeddings"] = tie
    model_cls = type(quantised)
    plain = model_cls(model_cls.config_class.from_dict(config))
    state = {key: value for key, value in quantised.state_dict().items() if not (tie and key in head_keys)}
    loaded = plain.load_state_dict(state, strict=False)
    if tie:
        plain.tie_weights()
    unfilled = set(loaded.missing_keys) - (head_keys if tie else set())
    head_weight, embedding_weight = plain.get_output_embeddings().weight, plain.get_input_embeddings().weight
    tied_ok = not tie or head_weight.data_ptr() == embedding_weight.data_ptr()
    if unfilled or loaded.unexpected_keys or not tied_ok:
        raise RuntimeProblem(
            Problem(
                "embedded model",
                type(quantised).__name__,
                f"converting the GGUF under transformers {transformers.__version__} left weights unset "
                f"({sorted(unfilled) or 'the LM head is not tied to the embeddings'})",
                "use transformers 4.46.3 or 5.x (the versions CI tests) and report this version as a neuron-ssp issue",
            )
        )
    return plain.eval()


def _match_gguf_tokenizer(tokenizer: PreTrainedTokenizerBase, gguf_path: Path) -> None:
    """Special tokens and BOS as the GGUF declares them (4.46 maps SmolLM2's EOS to <|im_start|>, adds a BOS)."""
    fields = gguf_reader(str(gguf_path)).fields

    def value(key: str) -> int | None:
        field = fields.get(f"tokenizer.ggml.{key}")
        return int(field.parts[field.data[0]][0]) if field is not None else None

    for attribute, key in SPECIAL_TOKENS.items():
        token_id = value(key)
        if token_id is not None and getattr(tokenizer, f"{attribute}_id") != token_id:
            setattr(tokenizer, attribute, tokenizer.convert_ids_to_tokens(token_id))
    bos = tokenizer.bos_token_id
    if value("add_bos_token") == 0 and bos is not None and tokenizer("a")["input_ids"][:1] == [bos]:
        tokenizer.add_bos_token = False  # LlamaTokenizerFast (4.4x) rebuilds its post-processor and saves the flag
    # decode text exactly as generated: 4.46 defaults to cleaning up spaces ("a ," -> "a,"), 5.x does not
    tokenizer.clean_up_tokenization_spaces = False


@functools.lru_cache(maxsize=2)
def gguf_reader(path: str) -> GGUFReader:
    """One read-only reader per GGUF file for the process: the conversion and the row kernel's block panels
    (backends/torch/block_panels.py) share the seconds its metadata takes to parse."""
    from gguf.gguf_reader import GGUFReader  # the class itself: _gguf_parsed_once swaps the package's name for this

    return GGUFReader(path, "r")


@contextmanager
def _gguf_parsed_once() -> Iterator[None]:
    """transformers opens the GGUF three times (tokenizer, config, weights) and we once more; parsing its
    metadata (49k vocabulary strings, 49k merges) takes seconds each time, most of a first run. Both import
    `gguf.GGUFReader` when they call it, so for the conversion it hands out one read-only reader per file."""
    import gguf

    original = gguf.GGUFReader

    def parsed_once(path: str | Path, mode: str = "r") -> gguf.GGUFReader:
        return gguf_reader(str(path)) if mode == "r" else original(path, mode)

    gguf.GGUFReader = parsed_once
    try:
        yield
    finally:
        gguf.GGUFReader = original


@contextmanager
def _tensor_maps_built_once() -> Iterator[None]:
    """transformers 5.x asks gguf for its tensor-name map once per module of the model (397 times for SmolLM2,
    `get_gguf_hf_weights_map`), and gguf 0.19 builds every architecture's patterns for every layer each
    time: 7-10 s of a first run. The map is only read (`get_name`), so one per (architecture, layers) serves
    every call; transformers imports the function when it calls it, so the conversion hands out the cached one."""
    import gguf

    original = gguf.get_tensor_name_map
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(original)
    try:
        yield
    finally:
        gguf.get_tensor_name_map = original


@contextmanager
def _quiet_transformers() -> Iterator[None]:
    level = transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_error()
    try:
        yield
    finally:
        transformers_logging.set_verbosity(level)
