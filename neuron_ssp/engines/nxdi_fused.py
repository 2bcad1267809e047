"""`speculation.engine: fused` on NxD Inference: draft loop, target window and acceptance in one NxDI graph.

NxDI 0.9.0 (4bcdc54b), `NeuronFusedSpecModel` (models/model_base.py:1598): a call with one input token at
position p runs the draft k times from p (`_token_gen_forward`, :1812; the k-th pass only fills its cache),
scores the input token and the k-1 drafts on the target in one k-wide pass, and keeps the drafts while they
equal the target's own tokens (`_tkg_postprocessor`, :2799): 1..k tokens per call, the rest of the row
padded with -1 (`acceptance_padding_token`). NxDI's speculation_length is our window k (unlike
transformers-neuronx's fused k, which counts drafted tokens). We drive it as NxDI's own
`_fused_assisted_decoding` does (utils/hf_adapter.py:495): the prompt through context encoding, then one
call per iteration with the last committed token, position_ids [[p]] and attention_mask ones(p).

The accepted row is `fused_outputs[0]` on a device (the KV cache stays there); on CPU NxDI keeps only the
first output, the row itself (`_get_constructed_outputs`, model_base.py:3807). Greedy only: with do_sample
the target samples just the window's last position (model_base.py:1162, a FIXME), refused by validate.
Acceptance statistics are exact (every call drafts k-1 and commits n); the draft/target time split is not
observable inside one graph and reads zero.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from typing import Any

import torch

from neuron_ssp.engines.base import GenerationResult, TokenCallback, check_room
from neuron_ssp.speculation.stats import GenerationStats
from neuron_ssp.topology.positions import NXDI, extra_target_slots

PADDING = -1  # NeuronFusedSpecModel.acceptance_padding_token (model_base.py:1650)
SEQ_IDS = torch.tensor([0], dtype=torch.int32)


class NxdiFusedEngine:
    """Same `generate` as `SpeculativeGenerator`, run by NxDI's fused speculation graph."""

    def __init__(self, target: Any, k: int):
        self.target = target  # OnDeviceBackend over the fused NeuronLlamaForCausalLM
        self.app = target.model
        self.k = k

    @torch.inference_mode()
    def generate(self, prompt_ids: torch.Tensor, max_new_tokens: int, eos_token_ids: Collection[int] = (),
                 on_tokens: TokenCallback | None = None) -> GenerationResult:
        prompt_len = prompt_ids.shape[0]
        check_room(self.target, prompt_len, max_new_tokens, "target.n_positions",
                   extra_target_slots("fused", self.k, NXDI))
        eos, stats, tokens = set(eos_token_ids), GenerationStats(k=self.k), []
        start = time.perf_counter()
        row = self._call(prompt_ids.view(1, -1), torch.arange(prompt_len).view(1, -1), prompt_len)
        committed = self._commit(row[:1], tokens, max_new_tokens, eos, on_tokens)
        while committed and len(tokens) < max_new_tokens and tokens[-1] not in eos:
            position = prompt_len + len(tokens) - 1  # the last committed token, not yet in either cache
            row = self._call(torch.tensor([[tokens[-1]]]), torch.tensor([[position]]), position)
            accepted = [t for t in row if t != PADDING]
            committed = self._commit(accepted, tokens, max_new_tokens, eos, on_tokens)
            stats.record_call(self.k - 1, len(accepted) - 1, committed)
        stats.wall_s = time.perf_counter() - start
        stats.new_tokens = len(tokens)
        return GenerationResult(tokens, stats)

    def _call(self, input_ids: torch.Tensor, position_ids: torch.Tensor, visible: int) -> list[int]:
        out = self.app(input_ids=input_ids, seq_ids=SEQ_IDS, position_ids=position_ids,
                       attention_mask=torch.ones(1, visible, dtype=torch.int64))
        fused = out.fused_outputs
        accepted = fused[0] if isinstance(fused, (list, tuple)) else fused
        return [int(t) for t in accepted.reshape(-1)]

    @staticmethod
    def _commit(new: list[int], tokens: list[int], limit: int, eos: set[int], on_tokens: TokenCallback | None) -> int:
        kept = new[: limit - len(tokens)]
        for i, token in enumerate(kept):
            if token in eos:
                kept = kept[: i + 1]
                break
        tokens += kept
        if on_tokens and kept:
            on_tokens(kept)
        return len(kept)
