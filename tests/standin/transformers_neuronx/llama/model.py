"""Stand-in of transformers_neuronx.llama.model.LlamaForSampling over a tiny torch Llama.

The KV cache is position-addressed like Neuron's: `cache_ids` name the slots the inputs are written
to. The stand-in stores the token of each slot of each cache row and computes each position from its
prefix (`_standin.PrefixScorer`: exact, and cheap enough for the embedded 135M model).

Two layouts, chosen by the model's NeuronConfig as in the real library:
- 1-D cache_ids (the default, batch 1): a position reads every slot before it, whatever was written
  there last; reading a slot never written raises, since on a device it would silently read garbage.
- 2-D cache_ids (batch, n) (`padding_side='right'` or continuous batching, `use_2d_cache_ids`): each
  input row has its own cache row (the row itself in a static batch; `start_ids[row]`, a sequence id,
  under continuous batching) and attends as the left-aligned masks of hlo.py say (1ade6d7 lines
  3507-3604): a token or a window reads the cache positions below the row's SMALLEST cache id, then the
  window's own tokens causally by their index; a context encoding reads its own tokens only (lines
  3110-3148). The library's preprocessing (base.py `_prepare_for_continuous_batching`, lines 492-587) is
  ported in base.py, padding rows and all. On a device a row that reads a slot never written (or the
  padding a context bucket wrote) computes garbage: here its logits are NaN, so a real row that does shows.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from transformers_neuronx import _standin
from transformers_neuronx.base import NeuronModelBase, context_bucket
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
        continuous = self.neuron_config.continuous_batching
        # the KV cache holds batch_size_for_shared_caches sequences under continuous batching (decoder.py)
        self.cache_rows = continuous.batch_size_for_shared_caches if continuous else batch_size
        self.caches: list[list[int | None]] = [[None] * n_positions for _ in range(self.cache_rows)]
        self._scorers: dict[int, _standin.PrefixScorer] = {}
        self.label = "model"

    if _standin.API == "sdk_2_18":

        def forward(self, input_ids, cache_ids=None, start_ids=None):
            return self._forward_last(input_ids, cache_ids, start_ids)
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
            return self._forward_last(input_ids, cache_ids, start_ids)

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
        if self.neuron_config.use_2d_cache_ids:
            return self._speculative_rows(input_ids, cache_ids, start_ids, k)
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

    def _forward_last(self, input_ids, cache_ids, start_ids):
        self._require_device()
        if self.neuron_config.use_2d_cache_ids:
            logits = self._forward_rows(input_ids, cache_ids, start_ids)
        else:
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
        """on_device_generation: the compiled graph returns the next token id (batch, 1), not logits, as int32 (the
        graph's U32/S32 ids reach torch as int32: compiler.py:226 at 1ade6d7)."""
        return LlamaForSampling._select(logits, generation).to(torch.int32)

    @staticmethod
    def _select(logits, generation):
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
            raise NotImplementedError(
                f"1-D cache_ids run batch 1 here, got input_ids {tuple(input_ids.shape)}: batch > 1 needs the "
                "2-D layout (NeuronConfig(padding_side='right') or continuous_batching)"
            )
        if cache_ids is None:
            return list(range(input_ids.shape[1]))
        slots = [int(c) for c in cache_ids.reshape(-1)]
        if len(slots) != input_ids.shape[1]:
            raise ValueError(f"{len(slots)} cache_ids for {input_ids.shape[1]} input ids")
        return slots

    def _scorer(self, row: int) -> _standin.PrefixScorer:
        if row not in self._scorers:
            self._scorers[row] = _standin.PrefixScorer(self.chkpt_model)
        return self._scorers[row]

    @torch.inference_mode()
    def _write_and_score(self, input_ids, slots, read, row=0):
        """1-D layout: write `input_ids` at `slots` of cache row `row`, then each position in `read` reads
        every slot up to itself."""
        cache = self.caches[row]
        if max(slots) >= self.n_positions or min(slots) < 0:
            raise IndexError(f"cache_ids {slots} outside the {self.n_positions} compiled positions")
        for slot, token in zip(slots, input_ids.view(-1).tolist(), strict=True):
            cache[slot] = token
        prefix = cache[: max(read) + 1]
        if None in prefix:
            raise RuntimeError(
                f"position {prefix.index(None)} is read but was never written (on a device this reads garbage)"
            )
        # each position's logits are a function of its prefix alone: a window scores bit-identically to
        # one-token calls at the same slots, and a wrong slot shows in every position that reads it
        return torch.stack([self._scorer(row).logits_after(prefix[: slot + 1]) for slot in read]).float()

    # ------------------------------------------------------------------ the 2-D layout

    def _forward_rows(self, input_ids, cache_ids, start_ids):
        """forward() in the 2-D layout: context encoding (several tokens from cache id 0) or one token per row."""
        n_seqs, n_active = input_ids.shape
        if cache_ids is None:  # base.py _preprocess, lines 604-607
            cache_ids = torch.arange(n_active, dtype=torch.int32).unsqueeze(0).expand(n_seqs, n_active)
        sent = _sent(input_ids, cache_ids, start_ids)
        if n_active > 1 and int(cache_ids.flatten()[0]) > 0:
            raise NotImplementedError(
                "the stand-in does not model forward() over several tokens past position 0 "
                "(the library's windowed context); speculative_forward scores windows"
            )
        tokens, cache_ids, seq_ids = self._prepare_for_continuous_batching(input_ids, cache_ids, start_ids)
        rows = (
            self._static_rows(n_seqs)
            if seq_ids is None or self.neuron_config.continuous_batching is None
            else [int(s) for s in seq_ids.view(-1)]
        )
        executed, logits = [], []
        if n_active > 1:
            bucket = context_bucket(self.n_positions, n_active)
            if n_active > bucket:
                raise NotImplementedError(
                    f"a static batch's context of {n_active} tokens runs past the largest "
                    f"context bucket ({bucket}): the library's leftover loop is not modelled"
                )
            last = cache_ids.max(dim=1).values  # base.py line 443: the last token's index
            static = self.neuron_config.continuous_batching is None
            for index, row in enumerate(rows):
                # a static batch's context cache is sized to the bucket (decoder.py:919-936) and replaced by index
                # (llama/hlo.py:747-752); under continuous batching the rows' cache_ids place the writes, padded
                # to 0..bucket-1 for a context shorter than its bucket (base.py _pad_cache_ids, lines 452-490).
                # Past the inputs the writes are padding (garbage)
                positions = list(range(bucket)) if static or n_active < bucket else [int(c) for c in cache_ids[index]]
                ids = tokens[index].tolist() + [0] * (len(positions) - n_active)
                executed.append({"row": row, "cache_ids": positions, "prior": 0})
                logits.append(self._run_row(row, ids, positions, 0, [int(last[index])], junk_from=n_active)[0])
        else:
            for index, row in enumerate(rows):
                position = int(cache_ids[index, 0])
                executed.append({"row": row, "cache_ids": [position], "prior": position})
                logits.append(self._run_row(row, tokens[index].tolist(), [position], position, [0])[0])
        _standin.RUNTIME.record(self.label, "forward", **sent, executed=executed)
        return self._postprocess(input_ids, torch.stack(logits), start_ids)

    def _speculative_rows(self, input_ids, cache_ids, start_ids, k):
        """speculative_forward() in the 2-D layout: (k, vocab, batch), each row on its own cache row."""
        n_seqs, _ = input_ids.shape
        if cache_ids is None:
            cache_ids = torch.arange(k, dtype=torch.int32).unsqueeze(0).expand(n_seqs, k)
        sent = _sent(input_ids, cache_ids, start_ids)
        _, cache_ids, seq_ids = self._prepare_for_continuous_batching(input_ids, cache_ids, start_ids)
        if cache_ids.shape[1] != k:
            raise RuntimeError(
                f"cache_ids {sent['cache_ids']}: the first cache id of the first row is 0, so transformers-neuronx "
                "takes this call for a context encoding (base.py line 502) and pads it to a context bucket; the "
                f"speculation network for {k} tokens then computes garbage"
            )
        rows = (
            self._static_rows(n_seqs)
            if seq_ids is None or self.neuron_config.continuous_batching is None
            else [int(s) for s in seq_ids.view(-1)]
        )
        executed, logits = [], []
        for index, row in enumerate(rows):
            positions = [int(c) for c in cache_ids[index]]
            prior = min(positions)  # hlo.py 1ade6d7 line 3588: reduce_min over the row's cache ids
            executed.append({"row": row, "cache_ids": positions, "prior": prior})
            logits.append(self._run_row(row, input_ids[index].tolist(), positions, prior, list(range(k))))
        _standin.RUNTIME.record(self.label, "speculative_forward", **sent, speculation_length=k, executed=executed)
        return torch.stack(logits, dim=-1)  # (k, V, batch)

    def _static_rows(self, n_seqs):
        """A static batch runs on the network compiled for its size; input row b is cache row b."""
        if n_seqs != self.cache_rows:
            raise KeyError(f"no network compiled for batch {n_seqs}: compiled for batch {self.cache_rows}")
        return list(range(n_seqs))

    @torch.inference_mode()
    def _run_row(self, row, tokens, positions, prior, wanted, junk_from=None):
        """Logits at the `wanted` indices of one row: token i reads the first `prior` positions of cache row
        `row` and tokens 0..i of this call; then every token is written at its position (the last write to a
        position wins; from index `junk_from` on, the writes are a bucket's padding: garbage)."""
        if not 0 <= row < self.cache_rows:
            raise IndexError(f"sequence id {row} outside the {self.cache_rows} cache rows")
        if max(positions) >= self.n_positions or min(positions) < 0:
            raise IndexError(f"cache_ids {positions} outside the {self.n_positions} compiled positions")
        cache = self.caches[row]
        context = cache[:prior]
        if None in context:
            rows = torch.full((len(wanted), self.config.vocab_size), float("nan"))
        else:
            rows = torch.stack([self._scorer(row).logits_after(context + tokens[: i + 1]) for i in wanted]).float()
        for index, position in enumerate(positions):
            cache[position] = None if junk_from is not None and index >= junk_from else tokens[index]
        return rows


def _sent(input_ids, cache_ids, start_ids):
    """What the caller sent, for the event log."""
    return {
        "cache_ids": cache_ids.tolist(),
        "start_ids": None if start_ids is None else start_ids.view(-1).tolist(),
        "input_ids": input_ids.tolist(),
    }
