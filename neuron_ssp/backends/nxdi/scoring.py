"""`ModelBackend` over an NxDI `NeuronLlamaForCausalLM` (batch 1), following NxDI's input rules.

`NeuronBaseForCausalLM.forward(input_ids, seq_ids, attention_mask, position_ids)` (model_base.py:3314 at
4bcdc54b) routes a call by its shape (`_get_model_outputs`, model_base.py:3549): position 0 first -> context
encoding; `input_ids` exactly `speculation_length` wide -> the speculation model; anything else -> the
token-generation model, which a target compiled with speculation_length = k does not have on hardware. So:
- prefill: the prompt at positions 0..P-1, attention_mask ones(P): context encoding (`fill_prefix` writes
  slots 0..P-1, kvcache/kv_cache_manager.py:509), logits of the last position;
- target window at slot `start`: always k tokens (a shorter window is padded by repeating its last token, as
  NxDI's own assisted decoding pads, hf_adapter.py:734), position_ids start..start+k-1, attention_mask
  ones(start): the cache slots already committed (`compute_for_token_gen` reads the prior cache only where
  the mask is set, attention/attention_base.py:1383, 1425; the k new tokens attend to each other through the
  causal active mask, model_base.py:813). Logits of all k positions;
- draft (speculation_length 0): one token per call, position_ids [[p]], attention_mask ones(p);
- seq_ids [0] (the one sequence; `preprocess_inputs` would default to arange(batch), model_base.py:3284).
Rollback: new keys/values are scattered at position_ids (`update_kv_by_layer_id`, kv_cache_manager.py:577-585)
and nothing at or past `start` is read, so a rejected suffix is stale and the next call overwrites it.
The bucket rule (`_get_seq_bucket`, model_wrapper.py:903) needs start + k <= n_positions for a window.
"""

from __future__ import annotations

from typing import Any

import torch

from neuron_ssp.backends.base import SingleSlot, check_compiled_room
from neuron_ssp.errors import Problem, UsageError
from neuron_ssp.topology.positions import NXDI, extra_target_slots

SEQ_IDS = torch.tensor([0], dtype=torch.int32)


class NxdiBackend(SingleSlot):
    """Scores through one NxDI application; knows nothing of acceptance."""

    def __init__(self, app: Any, name: str, vocab_size: int, n_positions: int, speculation_length: int | None):
        self.app = app
        self.name = name
        self.vocab_size = vocab_size
        self.n_positions = n_positions
        self.speculation_length = speculation_length
        self.compiled_windows = [speculation_length] if speculation_length else []
        self.max_score_width: int | None = speculation_length or 1
        # every call is k wide (topology.positions' NxDI rule), which engines.native.check_room adds
        self.padding_slots = extra_target_slots("native", speculation_length, NXDI) if speculation_length else 0

    def with_window(self, k: int) -> NxdiBackend:
        """NxDI compiles one speculation model of one width per target (speculation_length is one int)."""
        if k != self.speculation_length:
            raise UsageError(
                Problem(
                    "speculation.k",
                    k,
                    f"an NxD Inference target holds one speculation model (k={self.speculation_length}), not several",
                    f"load the target compiled for k={k} (neuron-ssp compile CONFIG --k {k}; tune-k loads one per k)",
                )
            )
        return self

    @torch.inference_mode()
    def prefill(self, prompt_ids: torch.Tensor) -> torch.Tensor:
        n = prompt_ids.shape[0]
        self._check_room(0, n)
        logits = self._forward(prompt_ids.view(1, -1), torch.arange(n).view(1, -1), n)
        return logits[0, -1, : self.vocab_size].float()

    @torch.inference_mode()
    def score(self, token_ids: torch.Tensor, start: int) -> torch.Tensor:
        n = token_ids.shape[0]
        k = self.speculation_length
        self._check_room(start, n)
        if not k:
            return torch.cat([self._one(token_ids[i : i + 1], start + i) for i in range(n)])
        rows = [self._window(token_ids[offset : offset + k], start + offset, k) for offset in range(0, n, k)]
        return torch.cat(rows)

    def _one(self, token: torch.Tensor, position: int) -> torch.Tensor:
        logits = self._forward(token.view(1, 1), torch.tensor([[position]]), position)
        return logits[0, :, : self.vocab_size].float()

    def _window(self, tokens: torch.Tensor, start: int, k: int) -> torch.Tensor:
        n = tokens.shape[0]
        self._check_room(start, k)
        padded = torch.cat([tokens, tokens[-1:].expand(k - n)])
        logits = self._forward(padded.view(1, k), torch.arange(start, start + k).view(1, -1), start)
        return logits[0, :n, : self.vocab_size].float()

    def _forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, committed: int) -> torch.Tensor:
        """One NxDI call; `committed` slots (0..committed-1) are visible through the attention mask."""
        out = self.app(
            input_ids=input_ids.to(torch.int64),
            seq_ids=SEQ_IDS,
            attention_mask=torch.ones(1, committed, dtype=torch.int64),
            position_ids=position_ids.to(torch.int64),
        )
        return out.logits

    def _check_room(self, start: int, n: int) -> None:
        why = " (an NxD Inference target scores every window k wide)"
        check_compiled_room(self.name, self.n_positions, start, n, why)
