"""An EAGLE-3 head's config.json: its shape, its vocabularies and the target layers it reads, checked.

The part of the checkpoint format (drafters/eagle_checkpoint.py, the one reader) that needs no tensors: validate
reads a head's config.json through it to hold the head against what a library runs (head_rules.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from neuron_ssp.errors import Problem

ARCHITECTURE = "LlamaForCausalLMEagle3"  # what SpecForge's configs name (configs/llama3-8B-eagle3.json)
TAPS_KEY = "eagle_aux_hidden_state_layer_ids"


@dataclass(frozen=True)
class EagleConfig:
    """The head's shape, from config.json. `taps`: the target layers whose INPUT residual stream the head reads
    (Hugging Face output_hidden_states[l]), None when the checkpoint does not say."""

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    draft_vocab_size: int
    target_hidden_size: int
    rms_norm_eps: float
    taps: tuple[int, ...] | None
    raw: dict[str, Any] = field(default_factory=dict, compare=False)  # config.json as read, for rope and writing

    def to_dict(self) -> dict[str, Any]:
        """config.json of this head: what was read, with the canonical keys set."""
        data = dict(self.raw)
        data.update(
            architectures=[ARCHITECTURE],
            model_type="llama",
            num_hidden_layers=1,
            hidden_act="silu",
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            vocab_size=self.vocab_size,
            draft_vocab_size=self.draft_vocab_size,
            rms_norm_eps=self.rms_norm_eps,
            tie_word_embeddings=False,
        )
        if self.target_hidden_size != self.hidden_size:
            data["target_hidden_size"] = self.target_hidden_size
        if self.taps is not None:
            data[TAPS_KEY] = list(self.taps)
        return data


def default_taps(num_layers: int) -> tuple[int, int, int]:
    """SafeAILab's and vLLM's taps for a target of `num_layers` decoder layers: the inputs of layers 2, N//2, N-3."""
    return (2, num_layers // 2, num_layers - 3)


def parse_config(data: dict[str, Any], file: str) -> tuple[EagleConfig | None, list[Problem]]:
    """The head's config from config.json's contents, and every problem with it."""
    problems: list[Problem] = []

    def need(key: str, what: str) -> int:
        value = data.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
        problems.append(
            Problem(f"{file}:{key}", value, f"must be a positive integer ({what})", f"set {key} in config.json")
        )
        return 1

    hidden = need("hidden_size", "the head's width")
    heads = need("num_attention_heads", "attention heads")
    kv_heads = data.get("num_key_value_heads") or heads
    inter = need("intermediate_size", "the MLP's width")
    vocab = need("vocab_size", "the TARGET's vocabulary")
    draft_vocab = data.get("draft_vocab_size") or vocab  # vLLM's default (llama_eagle3.py, Eagle3LlamaForCausalLM)
    head_dim = data.get("head_dim") or hidden // heads
    target_hidden = data.get("target_hidden_size") or hidden
    for key, value, rule, fix in _unsupported(data):
        problems.append(Problem(f"{file}:{key}", value, rule, fix))
    if not isinstance(draft_vocab, int) or not 0 < draft_vocab <= vocab:
        problems.append(
            Problem(
                f"{file}:draft_vocab_size",
                draft_vocab,
                f"must be a positive integer no larger than vocab_size ({vocab})",
                "set draft_vocab_size to the rows of lm_head.weight",
            )
        )
    taps = data.get(TAPS_KEY) or (data.get("eagle_config") or {}).get(TAPS_KEY)
    if taps is not None and not _valid_taps(taps):
        problems.append(
            Problem(
                f"{file}:{TAPS_KEY}",
                taps,
                "must list 3 distinct non-negative target layers (the inputs of the layers the head reads)",
                "write them as [2, N // 2, N - 3] for a target of N layers, or leave the key out for that default",
            )
        )
    if problems:
        return None, problems
    config = EagleConfig(
        hidden_size=hidden,
        intermediate_size=inter,
        num_attention_heads=heads,
        num_key_value_heads=int(kv_heads),
        head_dim=int(head_dim),
        vocab_size=vocab,
        draft_vocab_size=int(draft_vocab),
        target_hidden_size=int(target_hidden),
        rms_norm_eps=float(data.get("rms_norm_eps", 1e-6)),
        taps=tuple(taps) if taps is not None else None,
        raw=dict(data),
    )
    return config, problems


def _unsupported(data: dict[str, Any]) -> list[tuple[str, Any, str, str]]:
    """Variants of the format this head does not compute (it would silently compute something else)."""
    found = []
    if data.get("num_hidden_layers", 1) != 1:
        found.append(
            (
                "num_hidden_layers",
                data["num_hidden_layers"],
                "an EAGLE-3 head has one decoder layer",
                "use a one-layer EAGLE-3 head",
            )
        )
    if data.get("hidden_act", "silu") != "silu":
        found.append(("hidden_act", data["hidden_act"], "the head's MLP is Llama's (silu)", "use a Llama-style head"))
    for key in ("fc_norm", "norm_before_residual"):
        if data.get(key):
            found.append(
                (
                    key,
                    data[key],
                    f"{key} (a SpecForge / vLLM variant) is not computed by this head",
                    "use a head trained without it",
                )
            )
    if (data.get("eagle_config") or {}).get("use_aux_hidden_state") is False:
        found.append(
            (
                "eagle_config.use_aux_hidden_state",
                False,
                "a head without the three taps is EAGLE-1 style",
                "use drafter: eagle (NxD Inference) for EAGLE-1 heads",
            )
        )
    return found


def _valid_taps(taps: Any) -> bool:
    return (
        isinstance(taps, list | tuple)
        and len(taps) == 3
        and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in taps)
        and len(set(taps)) == 3
    )
