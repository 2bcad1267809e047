"""Stand-in of transformers_neuronx.llama.model.LlamaForSampling over a tiny torch Llama.

The KV cache is position-addressed like Neuron's: `cache_ids` name the slots the inputs are written
to. The stand-in stores the token of each slot of each cache row and computes each position from its
prefix (`_standin.PrefixScorer`: exact, and cheap enough for the embedded 135M model).

Every call first goes through the imitated commit's own host-side preprocessing (base.py `_preprocess`, ported in
`_preprocessing.py`) exactly where that commit's llama/model.py calls it: `forward` always; `speculative_forward`
always at 7a30b42 and 0623de2 (llama/model.py:189 there), only under continuous batching from c8d6bdc on
(:180-182 at c8d6bdc, :309-310 at 1ade6d7). The "device" then runs on what the preprocessing produced:
- a context network (several tokens): a static batch's context cache is sized to its bucket and replaced by index
  (decoder.py:919-936, llama/hlo.py:747-752 at 1ade6d7), so row b's tokens land at 0..bucket-1 of cache row b;
  under continuous batching the cache holds every sequence and the row's (padded) cache ids place the writes in
  the row its sequence id names. Past the inputs the writes are the bucket's padding: garbage;
- a decoding or speculation network: each row's tokens at its cache ids (a speculation network runs the first k
  columns of what it is given: decoder.py:526-527, `return_all_outputs`); the token bucket is chosen by the
  largest cache id of the whole call (decoder.py:490, :538-546) and recorded as `bucket`.
Two attention layouts, chosen by the model's NeuronConfig as in the real library:
- 1-D cache_ids (the default, batch 1): a position reads every slot before it, whatever was written
  there last; reading a slot never written raises, since on a device it would silently read garbage.
- 2-D cache_ids (batch, n) (`padding_side='right'` or continuous batching, `use_2d_cache_ids`): each row attends as
  the left-aligned masks of hlo.py say (1ade6d7 lines 3507-3604): a token or a window reads the cache positions
  below the row's SMALLEST cache id, then the window's own tokens causally by their index; a context encoding reads
  its own tokens only (lines 3110-3148). A row that reads a slot never written (or a bucket's padding) computes
  garbage on a device: here its logits are NaN, so a real row that does shows.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from transformers_neuronx import _standin
from transformers_neuronx.base import NeuronModelBase, context_buckets, token_bucket, token_buckets
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
        self.token_buckets = token_buckets(n_positions)  # llama/model.py:55-57: bucket.token_sizes, context_sizes
        self.context_buckets = context_buckets(n_positions)
        # the fused decoder reads these from the compiled decoder (token buckets end at n_positions)
        self.decoder_lm_head = SimpleNamespace(tp_degree=tp_degree, n_positions_list=self.token_buckets)
        self.ignored_kwargs = dict(kwargs)
        self.decoder_lm_head_for_speculation: dict[tuple[int, int], str] = {}  # (k, batch size): enabled networks
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
        if (k, input_ids.shape[0]) not in self.decoder_lm_head_for_speculation:
            raise KeyError(
                f"no speculative decoder compiled for speculation_length={k}, batch "
                f"{input_ids.shape[0]}: enabled {sorted(self.decoder_lm_head_for_speculation)}"
            )
        if input_ids.shape[1] != k:
            raise ValueError(
                f"the speculative decoder was compiled for {k} tokens, got input_ids of shape {tuple(input_ids.shape)}"
            )
        if self.neuron_config.use_2d_cache_ids:
            return self._speculative_rows(input_ids, cache_ids, start_ids, k)
        sent = self._slots_for(input_ids, cache_ids)
        tokens, slots = input_ids, torch.tensor(sent)
        if self._preprocesses_windows():
            tokens, slots, *_ = self._preprocess(input_ids, start_ids=start_ids, cache_ids=slots)
        slots = [int(c) for c in slots[:k]]  # the network runs the first k columns (decoder.py:526-527)
        _standin.RUNTIME.record(
            self.label,
            "speculative_forward",
            cache_ids=sent,
            speculation_length=k,
            input_ids=input_ids.view(-1).tolist(),
            slots=slots,
            bucket=token_bucket(self.n_positions, max(slots)),
        )
        logits = self._write_and_score(tokens[0, :k].tolist(), slots, slots)  # (k, V)
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
            logits = self._forward_slots(input_ids, cache_ids, start_ids)
        generation = self.neuron_config.on_device_generation
        return logits if generation is None else self.select_on_device(logits, generation)

    def _postprocessed(self, input_ids, logits, start_ids):
        """The commit's `_postprocess`: 1ade6d7 takes the original input ids too (llama/model.py:306)."""
        if _standin.COMMIT == "1ade6d7":
            return self._postprocess(input_ids, logits, start_ids=start_ids)
        return self._postprocess(logits, start_ids=start_ids)

    def _preprocesses_windows(self):
        """speculative_forward preprocesses always at 7a30b42 and 0623de2, only under continuous batching from
        c8d6bdc on (llama/model.py:180-182 there)."""
        return _standin.COMMIT in ("7a30b42", "0623de2") or self.neuron_config.continuous_batching is not None

    def _forward_slots(self, input_ids, cache_ids, start_ids):
        """forward() in the 1-D layout: the preprocessed cache ids place the writes (a context padded to its bucket:
        garbage past the prompt); the logits are the last real token's (past the largest bucket the library's
        context() finishes the prompt and returns the same)."""
        sent = self._slots_for(input_ids, cache_ids)
        n_active = input_ids.shape[1]
        tokens, slots, *_ = self._preprocess(input_ids, start_ids=start_ids, cache_ids=cache_ids)
        slots = [int(c) for c in slots.reshape(-1)]
        _standin.RUNTIME.record(
            self.label,
            "forward",
            cache_ids=None if cache_ids is None else sent,
            input_ids=input_ids.view(-1).tolist(),
            slots=slots,
            **({} if n_active > 1 else {"bucket": token_bucket(self.n_positions, slots[0])}),
        )
        logits = self._write_and_score(tokens[0].tolist(), slots, slots[n_active - 1 : n_active], junk_from=n_active)
        return self._postprocessed(input_ids, logits, start_ids)

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
        """The 1-D cache ids as sent (None: the prompt's own positions)."""
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
    def _write_and_score(self, tokens, slots, read, row=0, junk_from=None):
        """1-D layout: write `tokens` at `slots` of cache row `row` (from index `junk_from` on, a bucket's padding:
        garbage), then each position in `read` reads every slot up to itself."""
        cache = self.caches[row]
        if max(slots) >= self.n_positions or min(slots) < 0:
            raise IndexError(f"cache_ids {slots} outside the {self.n_positions} compiled positions")
        for index, (slot, token) in enumerate(zip(slots, tokens, strict=True)):
            cache[slot] = None if junk_from is not None and index >= junk_from else token
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
        tokens, cache_ids, seq_ids, last, *_ = self._preprocess(input_ids, start_ids=start_ids, cache_ids=cache_ids)
        rows = self._rows(tokens.shape[0], seq_ids)
        executed, logits = [], []
        if n_active > 1:
            width = tokens.shape[1]
            if width > self.context_buckets[-1]:
                raise NotImplementedError(
                    f"a context of {n_active} tokens runs past the largest context bucket "
                    f"({self.context_buckets[-1]}): the library's leftover loop is not modelled"
                )
            last = last.reshape(-1).expand(len(rows)) if last.numel() == 1 else last
            for index, row in enumerate(rows):
                positions = (
                    list(range(width))
                    if self.neuron_config.continuous_batching is None
                    else [int(c) for c in cache_ids[index, :width]]
                )
                executed.append({"row": row, "cache_ids": positions, "prior": 0})
                wanted = [int(last[index])]
                logits.append(self._run_row(row, tokens[index].tolist(), positions, 0, wanted, junk_from=n_active)[0])
            bucket = {}
        else:
            for index, row in enumerate(rows):
                position = int(cache_ids[index, 0])
                executed.append({"row": row, "cache_ids": [position], "prior": position})
                logits.append(self._run_row(row, tokens[index].tolist(), [position], position, [0])[0])
            bucket = {"bucket": token_bucket(self.n_positions, int(cache_ids.max()))}
        _standin.RUNTIME.record(self.label, "forward", **sent, executed=executed, **bucket)
        return self._postprocessed(input_ids, torch.stack(logits), start_ids)

    def _speculative_rows(self, input_ids, cache_ids, start_ids, k):
        """speculative_forward() in the 2-D layout: (k, vocab, batch), each row on its own cache row."""
        n_seqs, _ = input_ids.shape
        if cache_ids is None:
            cache_ids = torch.arange(k, dtype=torch.int32).unsqueeze(0).expand(n_seqs, k)
        sent = _sent(input_ids, cache_ids, start_ids)
        tokens, seq_ids = input_ids, start_ids
        if self._preprocesses_windows():
            tokens, cache_ids, seq_ids, *_ = self._preprocess(input_ids, start_ids=start_ids, cache_ids=cache_ids)
        rows = self._rows(n_seqs, seq_ids)
        executed, logits = [], []
        for index, row in enumerate(rows):
            positions = [int(c) for c in cache_ids[index, :k]]  # the network runs the first k columns
            prior = min(positions)  # hlo.py 1ade6d7 line 3588: reduce_min over the row's cache ids
            executed.append({"row": row, "cache_ids": positions, "prior": prior})
            logits.append(self._run_row(row, tokens[index, :k].tolist(), positions, prior, list(range(k))))
        bucket = token_bucket(self.n_positions, int(cache_ids.max()))
        _standin.RUNTIME.record(
            self.label, "speculative_forward", **sent, speculation_length=k, executed=executed, bucket=bucket
        )
        return torch.stack(logits, dim=-1)  # (k, V, batch)

    def _rows(self, n_rows, seq_ids):
        """The cache row each row of the call reads and writes: its sequence id under continuous batching (all
        the sequences, in order, once a one-token call is padded to them), else row b of a static batch, which
        runs on the network compiled for its size."""
        if self.neuron_config.continuous_batching is not None and seq_ids is not None:
            ids = [int(s) for s in seq_ids.reshape(-1)]
            return ids if len(ids) == n_rows else list(range(n_rows))
        if n_rows != self.cache_rows:
            raise KeyError(f"no network compiled for batch {n_rows}: compiled for batch {self.cache_rows}")
        return list(range(n_rows))

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
