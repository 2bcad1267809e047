"""Shared fixtures: tiny random Llama models built in the test, a fast table LM, the embedded model."""

from __future__ import annotations

import os

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from neuron_ssp.backends.base import ModelBackend, SingleSlot
from neuron_ssp.backends.torch.scoring import TorchBackend

TINY_VOCAB = 97

# Tests use tiny tensors: intra-op threads only add wake-up latency (milliseconds per op on a busy machine).
torch.set_num_threads(1)


def tiny_llama(seed: int, vocab_size: int = TINY_VOCAB, layers: int = 2) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
    )
    return LlamaForCausalLM(config).eval()


class TableBackend(SingleSlot):
    """A random second-order LM (logits from the last two tokens): exact, stateless and very fast.

    It keeps the ModelBackend contract (positions, widths) without a neural network, so statistical
    tests can afford tens of thousands of generations.
    """

    max_score_width: int | None = None

    def __init__(
        self, vocab_size: int, seed: int, sharpness: float = 2.0, n_positions: int = 512, flat_share: float = 0.0
    ):
        """`flat_share`: the share of two-token contexts whose logits are scaled to near-uniform, so the
        model is confident in some places and hesitant in others (what confidence policies react to)."""
        gen = torch.Generator().manual_seed(seed)
        self.table = torch.randn(vocab_size, vocab_size, vocab_size, generator=gen) * sharpness
        if flat_share:
            flat = torch.rand(vocab_size, vocab_size, 1, generator=gen) < flat_share
            self.table = torch.where(flat, self.table * 0.05 / sharpness, self.table)
        self.vocab_size = vocab_size
        self.n_positions = n_positions
        self.name = f"table{seed}"
        self.tokens = torch.zeros(n_positions, dtype=torch.long)
        self.calls: list[tuple[int, int]] = []

    def _logits_after(self, position: int) -> torch.Tensor:
        prev = self.tokens[position - 1] if position >= 1 else 0
        return self.table[prev, self.tokens[position]]

    def perturbed(self, scale: float, seed: int) -> TableBackend:
        """A copy whose logits carry extra noise: a draft that agrees with this model often, not always."""
        copy = TableBackend(self.vocab_size, seed, n_positions=self.n_positions)
        noise = torch.randn(self.table.shape, generator=torch.Generator().manual_seed(seed))
        copy.table = self.table + scale * noise
        return copy

    @property
    def highest_slot(self) -> int:
        return max(start + n - 1 for start, n in self.calls)

    def prefill(self, prompt_ids: torch.Tensor) -> torch.Tensor:
        self.tokens[: len(prompt_ids)] = prompt_ids
        self.calls.append((0, len(prompt_ids)))
        return self._logits_after(len(prompt_ids) - 1).clone()

    def score(self, token_ids: torch.Tensor, start: int) -> torch.Tensor:
        self.tokens[start : start + len(token_ids)] = token_ids
        self.calls.append((start, len(token_ids)))
        return torch.stack([self._logits_after(p) for p in range(start, start + len(token_ids))])


@pytest.fixture
def tiny_pair() -> tuple[LlamaForCausalLM, LlamaForCausalLM]:
    """(target, draft): two different random tiny Llamas with one vocabulary."""
    return tiny_llama(0), tiny_llama(1, layers=1)


def backend(model: LlamaForCausalLM, n_positions: int = 512) -> TorchBackend:
    return TorchBackend(model, n_positions)


@pytest.fixture(scope="session")
def embedded_cache(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One conversion of the embedded GGUF for the whole session (slow tests only)."""
    cache = os.environ.get("NEURON_SSP_TEST_CACHE") or str(tmp_path_factory.mktemp("neuron-ssp-cache"))
    return cache


@pytest.fixture
def use_embedded_cache(embedded_cache: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("NEURON_SSP_CACHE", embedded_cache)
    return embedded_cache


# the type checker holds the stand-in backend against the interface the loop takes (CI runs mypy over this file)
STANDS_IN_FOR: type[ModelBackend] = TableBackend
