"""Helpers for the Neuron tests: tiny Llama models and configs for them (fixtures: neuron_fixtures.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from neuron_ssp.config import Config, config_from_dict

STANDIN = Path(__file__).parent / "standin"
VOCAB = 96


def save_tiny_llama(directory: Path, seed: int, layers: int = 2) -> Path:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        bos_token_id=1,
        eos_token_id=2,
    )
    LlamaForCausalLM(config).eval().save_pretrained(directory)
    return directory


def with_tokenizer(model_dir: Path, tmp_path: Path, chat_template: str | None = None) -> Path:
    """A copy of a tiny model dir plus a word-level tokenizer over its vocabulary ("w3" .. "w95")."""
    target = tmp_path / model_dir.name
    shutil.copytree(model_dir, target)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, VOCAB)}}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    tokenizer.chat_template = chat_template
    tokenizer.save_pretrained(target)
    return target


def with_eos(model_dir: Path, eos: list[int]) -> Path:
    """The checkpoint's generation_config.json declares these end-of-sequence ids."""
    (model_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    return model_dir


def neuron_config(target: Path, draft: Path | None = None, /, **sections: Any) -> Config:
    """A valid Neuron config for the tiny models on a trn1.32xlarge (tp 2, 128 positions)."""
    model = {"tp_degree": 2, "n_positions": 128, "dtype": "fp32"}
    data: dict[str, Any] = {
        "name": "tiny-neuron",
        "platform": {"backend": "neuron", "instance_type": "trn1.32xlarge"},
        "target": {"path": str(target), **model},
        "speculation": {"k": 4, "drafter": "model" if draft else "ngram", "acceptor": "greedy"},
        "generation": {"max_new_tokens": 24},
    }
    if draft is not None:
        data["draft"] = {"path": str(draft), **model}
    for section, values in sections.items():
        data[section] = {**data.get(section, {}), **values}
    return config_from_dict(data)


def prompt(length: int = 7, seed: int = 3) -> torch.Tensor:
    return torch.randint(3, VOCAB, (length,), generator=torch.Generator().manual_seed(seed))


def reimport_standin(monkeypatch: Any, **switches: str) -> Any:
    """A fresh stand-in "process" with stand-in switches (env vars such as NEURONX_STANDIN_COMMIT) set."""
    import sys

    for name, value in switches.items():
        monkeypatch.setenv(name, value)
    for name in [m for m in sys.modules if m.split(".")[0] == "transformers_neuronx"]:
        del sys.modules[name]
    import transformers_neuronx._standin as standin

    standin.reset()
    return standin


def speculative(config: Config, target: Any, draft: Any, acceptor: Any) -> Any:
    """Our loop over Neuron backends: the model drafter when there is a draft, else prompt lookup."""
    from neuron_ssp.drafters import ModelDrafter, NgramDrafter
    from neuron_ssp.engines.base import sampling_params
    from neuron_ssp.engines.native import SpeculativeGenerator
    from neuron_ssp.speculation.call_cost import target_cost
    from neuron_ssp.speculation.policies import build_policy

    rng, spec = torch.Generator(), config.speculation
    drafter = (
        ModelDrafter(draft, sampling_params(config.sampling), rng)
        if draft is not None
        else NgramDrafter(target.vocab_size)
    )
    return SpeculativeGenerator(
        target,
        drafter,
        acceptor,
        build_policy(spec, target_cost(target, spec.k) if spec.policy == "cost" else None),
        config.sampling,
        spec.k,
        rng,
    )


def check_self_draft_accepts_everything(config: Config, target: Any, draft: Any) -> None:
    """The target as its own draft: every greedy draft accepted, output equal to plain greedy decoding."""
    from neuron_ssp.engines.native import plain_generate
    from neuron_ssp.speculation.acceptors import GreedyAcceptor

    ids = prompt(7)
    ssp = speculative(config, target, draft, GreedyAcceptor()).generate(ids, 24)
    assert ssp.tokens == plain_generate(target, ids, 24, config.sampling).tokens
    assert ssp.stats.acceptance_rate == 1.0
