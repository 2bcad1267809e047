"""Stand-in of transformers_neuronx.llama.model.LlamaForSampling over a tiny torch Llama.

The KV cache is position-addressed like Neuron's: `cache_ids` name the slots the inputs are written
to, and a position reads every slot before it, whatever was written there last. The stand-in stores
the token of each slot and computes each position from its prefix (`_standin.PrefixScorer`: exact, and
cheap enough for the embedded 135M model); reading a slot never written raises, since on a device it
would silently read garbage.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from transformers_neuronx import _standin
from transformers_neuronx.base import NeuronModelBase
from transformers_neuronx.config import NeuronConfig


class LlamaForSampling(NeuronModelBase):
    def __init__(
        self,
        config,
        *,
        n_positions=2048,
        batch_size=1,
        amp="f32",
        tp_degree=2,
        context_length_estimate=None,
        context_unroll=None,
        unroll=None,
        neuron_config=None,
        prefixed_length=0,
        **kwargs,
    ):
        super().__init__()
        self.config = config
        self.n_positions = n_positions
        self.batch_size = batch_size
        self.amp = amp
        self.tp_degree = tp_degree
        self.neuron_config = neuron_config if neuron_config is not None else NeuronConfig()
        self.batch_sizes = [batch_size]
        # the fused decoder reads these from the compiled decoder (token buckets end at n_positions)
        self.decoder_lm_head = SimpleNamespace(tp_degree=tp_degree, n_positions_list=[n_positions])
        self.ignored_kwargs = dict(kwargs)
        self.speculation_decoders: set[tuple[int, int]] = set()
        self.slots: list[int | None] = [None] * n_positions
        self.label = "model"

    if _standin.API == "sdk_2_18":

        def forward(self, input_ids, cache_ids=None, start_ids=None):
            return self._forward_last(input_ids, cache_ids)
    else:

        def forward(
            self,
            input_ids,
            cache_ids=None,
            start_ids=None,
            last_token_id=None,
            input_embeddings=None,
            **kwargs,
        ):
            return self._forward_last(input_ids, cache_ids)

    def speculative_forward(self, input_ids, cache_ids=None, start_ids=None, speculation_length=None):
        self._require_device()
        k = speculation_length
        if (k, input_ids.shape[0]) not in self.speculation_decoders:
            raise KeyError(
                f"no speculative decoder compiled for speculation_length={k}, batch "
                f"{input_ids.shape[0]}: enabled {sorted(self.speculation_decoders)}"
            )
        if input_ids.shape[1] != k:
            raise ValueError(
                f"the speculative decoder was compiled for {k} tokens, got input_ids of shape {tuple(input_ids.shape)}"
            )
        slots = self._slots_for(input_ids, cache_ids)
        if _standin.CAPPED_CACHE_ID is not None and len(slots) > 1:  # snapshot 0623de2's _pad_cache_ids
            slots = [min(slot, _standin.CAPPED_CACHE_ID) for slot in slots]
        _standin.RUNTIME.record(
            self.label,
            "speculative_forward",
            cache_ids=slots,
            speculation_length=k,
            input_ids=input_ids.view(-1).tolist(),
        )
        logits = self._write_and_score(input_ids, slots, slots)  # (k, V)
        return logits.unsqueeze(-1)  # (k, V, batch)

    def sample(
        self,
        input_ids,
        sequence_length,
        cache_ids=None,
        start_ids=None,
        top_k=50,
        top_p=1.0,
        eos_token_override=None,
        temperature=1.0,
        streamer=None,
        stopping_criteria_list=None,
        no_repeat_ngram_size=None,
        **kwargs,
    ):
        """Plain top-k sampling until `sequence_length` positions; returns the inputs and the new tokens."""
        eos = self.config.eos_token_id if eos_token_override is None else eos_token_override
        tokens = [input_ids]
        scores = self(input_ids, cache_ids, start_ids)
        start = int(cache_ids.view(-1)[-1]) + 1 if cache_ids is not None else input_ids.shape[1]
        for cur_len in range(start, sequence_length):
            values, indices = torch.topk(scores / temperature, min(top_k, scores.shape[-1]), dim=-1)
            token = torch.gather(indices, 1, torch.multinomial(values.softmax(-1), 1))
            tokens.append(token)
            if cur_len + 1 >= sequence_length or int(token) == eos:
                break
            scores = self(token, torch.as_tensor([cur_len], dtype=torch.int32), start_ids)
        return torch.cat(tokens, dim=-1)

    # ------------------------------------------------------------------ stand-in internals

    def _forward_last(self, input_ids, cache_ids):
        self._require_device()
        slots = self._slots_for(input_ids, cache_ids)
        _standin.RUNTIME.record(
            self.label,
            "forward",
            cache_ids=None if cache_ids is None else slots,
            input_ids=input_ids.view(-1).tolist(),
        )
        logits = self._write_and_score(input_ids, slots, slots[-1:])  # (batch, V): the LAST position only
        generation = self.neuron_config.on_device_generation
        return logits if generation is None else self.select_on_device(logits, generation)

    @staticmethod
    def select_on_device(logits, generation):
        """on_device_generation: the compiled graph returns the next token id (batch, 1), not logits."""
        if not generation.do_sample:
            return logits.argmax(-1, keepdim=True)
        scores = logits / generation.temperature
        if generation.top_k:
            threshold = torch.topk(scores, min(generation.top_k, scores.shape[-1]), dim=-1).values[..., -1:]
            scores = scores.masked_fill(scores < threshold, float("-inf"))
        probs = scores.softmax(-1)
        if generation.top_p < 1.0:
            ordered, order = probs.sort(dim=-1, descending=True)
            drop = ordered.cumsum(-1) - ordered > generation.top_p
            probs = probs.scatter(-1, order, ordered.masked_fill(drop, 0.0))
        return torch.multinomial(probs, 1)

    def _require_device(self):
        if not getattr(self, "on_neuron", False):
            raise RuntimeError("the model is not on a Neuron device: call to_neuron() first")

    def _slots_for(self, input_ids, cache_ids):
        if input_ids.dim() != 2 or input_ids.shape[0] != 1:
            raise NotImplementedError(f"the stand-in runs batch 1 only, got input_ids {tuple(input_ids.shape)}")
        if cache_ids is None:
            return list(range(input_ids.shape[1]))
        slots = [int(c) for c in cache_ids.reshape(-1)]
        if len(slots) != input_ids.shape[1]:
            raise ValueError(f"{len(slots)} cache_ids for {input_ids.shape[1]} input ids")
        return slots

    @torch.inference_mode()
    def _write_and_score(self, input_ids, slots, read):
        if max(slots) >= self.n_positions or min(slots) < 0:
            raise IndexError(f"cache_ids {slots} outside the {self.n_positions} compiled positions")
        for slot, token in zip(slots, input_ids.view(-1).tolist(), strict=True):
            self.slots[slot] = token
        prefix = self.slots[: max(read) + 1]
        if None in prefix:
            raise RuntimeError(
                f"position {prefix.index(None)} is read but was never written (on a device this reads garbage)"
            )
        if getattr(self, "_scorer", None) is None:
            self._scorer = _standin.PrefixScorer(self.chkpt_model)
        # each position's logits are a function of its prefix alone: a window scores bit-identically to
        # one-token calls at the same slots, and a wrong slot shows in every position that reads it
        return torch.stack([self._scorer.logits_after(prefix[: slot + 1]) for slot in read]).float()
