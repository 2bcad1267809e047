"""The host-side preprocessing of transformers_neuronx.base.NeuronModelBase, ported from each commit the stand-in
imitates (test-only module; the real methods live on NeuronModelBase, which mixes the right class in).

What runs on the host before a network does decides which cache ids reach the device, so it is ported statement
for statement, per commit, without the branches for options this package never sets (paged attention, chunked
prefill, EAGLE, the 1-D query, prefixed_length):
- `_prepare_for_continuous_batching`: 7a30b42 base.py:278-307 (no window branch: a window falls into the one-token
  padding and fails there), 0623de2 :314-366 (a window's cache ids padded with 0 to a context bucket), c8d6bdc
  :333-389 and 1ade6d7 :492-587 (padded with max(context_buckets) - 1 to the speculation bucket);
- `_prepare_for_par_ctx_rhs_padding` and `_pad_cache_ids`: 7a30b42 :242-276 (pads the inputs only), 0623de2
  :248-312 (a 2-D window's cache ids become arange(bucket), :291-295), c8d6bdc :259-331 and 1ade6d7 :326-490 (a
  window keeps its cache ids, padded to its speculation bucket: :285-288, :310-312 at c8d6bdc);
- `_preprocess` and `_postprocess` as each commit chains them.
"""

from __future__ import annotations

import bisect

import torch


def find(buckets, size):
    """bucket.find (the same at every commit): the smallest bucket that fits `size`, else the largest."""
    return buckets[bisect.bisect_left(buckets, size, hi=len(buckets) - 1)]


def pad(tensor, dim, size):
    """utils.pad(tensor, dim, size, left=False): zeros on the right of `dim` up to `size`, never truncating."""
    if tensor is None or size <= tensor.shape[dim]:
        return tensor
    missing = size - tensor.shape[dim]
    widths = [0, 0] * (tensor.dim() - 1 - dim) + [0, missing]
    return torch.nn.functional.pad(tensor, widths)


def _speculation_buckets(model):
    return sorted({k for k, _ in model.decoder_lm_head_for_speculation})


class Preprocess7a30b42:
    def _prepare_for_par_ctx_rhs_padding(self, input_ids):  # base.py:242-276
        batch_size, context_length = input_ids.shape
        last_token_id = torch.as_tensor(0, dtype=torch.int32)
        if context_length == 1:
            return input_ids, last_token_id
        estimate = find(self.context_buckets, context_length)
        if estimate:
            last_token_id = torch.as_tensor(min(context_length - 1, estimate - 1), dtype=torch.int32)
            if context_length < estimate:
                input_ids = pad(input_ids, 1, estimate)
        return input_ids, last_token_id

    def _prepare_for_continuous_batching(self, input_ids, cache_ids=None, seq_ids=None):  # base.py:278-307
        n_seqs, n_active_tokens = input_ids.shape
        continuous_batching = self.neuron_config and self.neuron_config.continuous_batching
        if seq_ids is None or not continuous_batching:
            return input_ids, cache_ids, seq_ids
        batch_size = self.neuron_config.continuous_batching.batch_size_for_shared_caches
        if n_active_tokens > 1 and cache_ids.flatten()[0].item() == 0:
            n_active_seqs, n_active_tokens = input_ids.shape
            n_positions = self.context_buckets[-1]
            assert n_active_seqs == cache_ids.shape[0], (
                f"invalid n_active_seqs ({n_active_seqs} vs {cache_ids.shape[0]})"
            )
            assert n_active_tokens <= n_positions, f"invalid input prompt length ({n_active_tokens} <= {n_positions})"
            cache_ids_pad = torch.zeros(n_active_seqs, n_positions, dtype=cache_ids.dtype)
            for seq_id in range(n_active_seqs):
                cache_ids_pad[seq_id, :n_active_tokens] = cache_ids[seq_id, :n_active_tokens]
            return input_ids, cache_ids_pad, seq_ids
        full_input_ids = torch.zeros(batch_size, 1, dtype=input_ids.dtype)
        full_cache_ids = torch.zeros(batch_size, 1, dtype=cache_ids.dtype)
        for idx, seq_id in enumerate(seq_ids.flatten()):
            seq_id = seq_id.item()
            full_input_ids[seq_id, :] = input_ids[idx, :]  # a window (n_active_tokens > 1) fails here
            full_cache_ids[seq_id, :] = cache_ids[idx, :]
        return full_input_ids, full_cache_ids, seq_ids

    def _preprocess(self, input_ids, start_ids=None, cache_ids=None):  # base.py:309-328
        input_ids, cache_ids, start_ids = self._prepare_for_continuous_batching(input_ids, cache_ids, start_ids)
        input_ids, last_token_id = self._prepare_for_par_ctx_rhs_padding(input_ids)
        batch_size, context_length = input_ids.shape
        if start_ids is None:
            start_ids = torch.zeros(batch_size, dtype=torch.int32)
        if cache_ids is None:
            cache_ids = torch.arange(context_length, dtype=torch.int32)
        return input_ids, cache_ids, start_ids, last_token_id

    def _postprocess(self, logits, start_ids=None):  # base.py:330-348
        if start_ids is None:
            return logits
        running_batch_size, n_embed = logits.shape
        input_batch_size = start_ids.shape[0]
        if running_batch_size == input_batch_size:
            return logits
        seq_ids = start_ids.flatten().tolist()
        new_logits = torch.zeros(input_batch_size, n_embed, dtype=logits.dtype)
        for idx, seq_id in enumerate(seq_ids):
            new_logits[idx, :] = logits[seq_id, :]
        return new_logits


class Preprocess0623de2(Preprocess7a30b42):
    def _prepare_for_par_ctx_rhs_padding(self, input_ids, cache_ids):  # base.py:248-289
        batch_size, context_length = input_ids.shape
        if self.neuron_config.vectorize_last_token_id:
            last_token_id = torch.zeros(batch_size, dtype=torch.int32)
        else:
            last_token_id = torch.as_tensor(0, dtype=torch.int32)
        if context_length == 1:
            return input_ids, cache_ids, last_token_id
        estimate = self._rhs_estimate(cache_ids, context_length)
        if estimate:
            if self.neuron_config.vectorize_last_token_id:
                last_token_id = cache_ids.max(dim=1).values
            else:
                last_token_id = torch.as_tensor([min(context_length - 1, estimate - 1)], dtype=torch.int32)
            if context_length < estimate:
                input_ids = pad(input_ids, 1, estimate)
                cache_ids = self._pad_cache_ids(cache_ids, batch_size, context_length, estimate)
        return input_ids, cache_ids, last_token_id

    def _rhs_estimate(self, cache_ids, context_length):
        """The width a context (or, here, a window) is padded to: its context bucket (base.py:275-277)."""
        return find(self.context_buckets, context_length)

    def _pad_cache_ids(self, cache_ids, batch_size, context_length, estimate):  # base.py:291-312
        if self.neuron_config.use_2d_cache_ids:
            # TODO: fix cache_ids padding for batch speculative decoding (the real comment, :292)
            cache_ids = torch.arange(estimate, dtype=torch.long)
            cache_ids = cache_ids.unsqueeze(0).expand(batch_size, estimate)
        elif cache_ids is None:
            cache_ids = torch.arange(estimate, dtype=torch.long)
        else:
            start_idx = cache_ids[-1].item() + 1
            end_idx = estimate + start_idx - context_length
            pad_elements = torch.arange(start_idx, end_idx, dtype=torch.long)
            cache_ids_pad = torch.concat([cache_ids, pad_elements], dim=0)
            cache_ids = torch.minimum(cache_ids_pad, torch.tensor(estimate - 1, dtype=torch.long))
        return cache_ids

    def _prepare_for_continuous_batching(self, input_ids, cache_ids=None, seq_ids=None):  # base.py:314-366
        n_seqs, n_active_tokens = input_ids.shape
        continuous_batching = self.neuron_config and self.neuron_config.continuous_batching
        if seq_ids is None or not continuous_batching:
            return input_ids, cache_ids, seq_ids
        if n_active_tokens > 1 and cache_ids.flatten()[0].item() == 0:
            return self._context_rows(input_ids, cache_ids, seq_ids)
        elif n_active_tokens > 1 and cache_ids.flatten()[0].item() > 0:
            return self._window_rows(input_ids, cache_ids, seq_ids)
        return self._token_rows(input_ids, cache_ids, seq_ids)

    def _window_rows(self, input_ids, cache_ids, seq_ids):
        """The window branch (:336-356): the cache ids padded with 0 to a context bucket."""
        n_active_seqs, n_active_tokens = input_ids.shape
        speculative_n_positions = find(self.context_buckets, n_active_tokens)
        assert n_active_tokens <= speculative_n_positions, (
            f"invalid input prompt length ({n_active_tokens} <= {speculative_n_positions})"
        )
        speculation_batches = [batch for (_, batch) in self.decoder_lm_head_for_speculation]
        assert n_active_seqs in speculation_batches, (
            f"invalid batch size for speculative forward ({n_active_seqs} not in {speculation_batches})"
        )
        if len(cache_ids.shape) == 1:
            cache_ids = cache_ids.unsqueeze(0)
        cache_ids_pad = torch.zeros(n_active_seqs, speculative_n_positions, dtype=cache_ids.dtype)
        for seq_id in range(n_active_seqs):
            cache_ids_pad[seq_id, :n_active_tokens] = cache_ids[seq_id, :n_active_tokens]
        return input_ids, cache_ids_pad, seq_ids

    def _token_rows(self, input_ids, cache_ids, seq_ids):
        """The one-token branch (:358-366): every sequence of the shared cache, the missing ones token 0 at 0."""
        batch_size = self.neuron_config.continuous_batching.batch_size_for_shared_caches
        full_input_ids = torch.zeros(batch_size, 1, dtype=input_ids.dtype)
        full_cache_ids = torch.zeros(batch_size, 1, dtype=cache_ids.dtype)
        for idx, seq_id in enumerate(seq_ids.flatten()):
            seq_id = seq_id.item()
            full_input_ids[seq_id, :] = input_ids[idx, :]
            full_cache_ids[seq_id, :] = cache_ids[idx, :]
        return full_input_ids, full_cache_ids, seq_ids

    def _context_rows(self, input_ids, cache_ids, seq_ids):
        """The context branch, the same from 0623de2 on (:324-334 there, :502-512 at 1ade6d7)."""
        n_active_seqs, n_active_tokens = input_ids.shape
        continuous_batching_n_positions = find(self.context_buckets, n_active_tokens)
        assert n_active_seqs == cache_ids.shape[0], f"invalid n_active_seqs ({n_active_seqs} vs {cache_ids.shape[0]})"
        assert n_active_tokens <= continuous_batching_n_positions, (
            f"invalid input prompt length ({n_active_tokens} <= {continuous_batching_n_positions})"
        )
        cache_ids_pad = torch.zeros(n_active_seqs, continuous_batching_n_positions, dtype=cache_ids.dtype)
        for seq_id in range(n_active_seqs):
            cache_ids_pad[seq_id, :n_active_tokens] = cache_ids[seq_id, :n_active_tokens]
        return input_ids, cache_ids_pad, seq_ids

    def _preprocess(self, input_ids, start_ids=None, cache_ids=None):  # base.py:368-389
        input_ids, cache_ids, start_ids = self._prepare_for_continuous_batching(input_ids, cache_ids, start_ids)
        input_ids, cache_ids, last_token_id = self._prepare_for_par_ctx_rhs_padding(input_ids, cache_ids)
        batch_size, context_length = input_ids.shape
        if start_ids is None:
            start_ids = torch.zeros(batch_size, dtype=torch.int32)
        if cache_ids is None:
            cache_ids = torch.arange(context_length, dtype=torch.int32)
            if self.neuron_config.use_2d_cache_ids:
                cache_ids = cache_ids.unsqueeze(0).expand(batch_size, context_length)
        return input_ids, cache_ids, start_ids, last_token_id


class PreprocessC8d6bdc(Preprocess0623de2):
    # _prepare_for_par_ctx_rhs_padding (base.py:259-304) is 0623de2's but for the estimate of a window

    def _rhs_estimate(self, cache_ids, context_length):
        if cache_ids is not None and cache_ids.flatten()[0].item() > 0:  # :285-288, a window: its speculation bucket
            return find(_speculation_buckets(self), context_length)
        return super()._rhs_estimate(cache_ids, context_length)

    def _pad_cache_ids(self, cache_ids, batch_size, context_length, estimate):  # base.py:306-331
        if self.neuron_config.use_2d_cache_ids and cache_ids.flatten()[0].item() > 0:
            return cache_ids  # :310-312: a window keeps its cache ids ("TODO: fix cache_ids padding ...")
        return super()._pad_cache_ids(cache_ids, batch_size, context_length, estimate)

    def _token_rows(self, input_ids, cache_ids, seq_ids):
        """The one-token branch (:380-389): int32, and the sequence ids become arange(batch)."""
        batch_size = self.neuron_config.continuous_batching.batch_size_for_shared_caches
        full_input_ids = torch.zeros(batch_size, 1, dtype=torch.int32)
        full_cache_ids = torch.zeros(batch_size, 1, dtype=torch.int32)
        full_seq_ids = torch.arange(batch_size, dtype=torch.int32)
        for idx, seq_id in enumerate(seq_ids.flatten()):
            seq_id = seq_id.item()
            full_input_ids[seq_id, :] = input_ids[idx, :]
            full_cache_ids[seq_id, :] = cache_ids[idx, :]
        return full_input_ids, full_cache_ids, full_seq_ids

    def _window_rows(self, input_ids, cache_ids, seq_ids):
        """The window branch, the same at c8d6bdc (:355-378) and 1ade6d7 (:539-562): padded to the speculation
        bucket with max(context_buckets) - 1."""
        n_active_seqs, n_active_tokens = input_ids.shape
        speculative_n_positions = find(self.context_buckets, n_active_tokens)
        assert n_active_tokens <= speculative_n_positions, (
            f"invalid input prompt length ({n_active_tokens} <= {speculative_n_positions})"
        )
        speculation_bucket = find(_speculation_buckets(self), n_active_tokens)
        speculation_batches = [batch for (_, batch) in self.decoder_lm_head_for_speculation]
        assert n_active_seqs in speculation_batches, (
            f"invalid batch size for speculative forward ({n_active_seqs} not in {speculation_batches})"
        )
        if len(cache_ids.shape) == 1:
            cache_ids = cache_ids.unsqueeze(0)
        assert cache_ids.shape[0] == n_active_seqs, (
            f"invalid n_active_seqs ({n_active_seqs} vs {cache_ids.shape[0]}) in speculative forward"
        )
        # pad cache IDs with max(n_positions) - 1: unlike context encoding, padding with 0 during
        # speculative_forward would contaminate the kv-cache history (the real comment)
        cache_ids_pad = torch.full(
            (n_active_seqs, speculation_bucket), max(self.context_buckets) - 1, dtype=cache_ids.dtype
        )
        for seq_id in range(n_active_seqs):
            cache_ids_pad[seq_id, :n_active_tokens] = cache_ids[seq_id, :n_active_tokens]
        return input_ids, cache_ids_pad, seq_ids

    def _postprocess(self, logits, start_ids=None):  # base.py:414-433
        if start_ids is None:
            return logits
        running_batch_size, _ = logits.shape
        input_batch_size = start_ids.shape[0]
        if running_batch_size == input_batch_size:
            return logits
        seq_ids = start_ids.flatten()
        if torch.equal(seq_ids, torch.arange(input_batch_size)):
            return logits[:input_batch_size]
        return logits[seq_ids]


class Preprocess1ade6d7(PreprocessC8d6bdc):
    def _prepare_for_par_ctx_rhs_padding(self, input_ids, cache_ids, start_ids=None, **kwargs):  # base.py:326-450
        input_ids, cache_ids, last_token_id = super()._prepare_for_par_ctx_rhs_padding(input_ids, cache_ids)
        return input_ids, cache_ids, last_token_id, torch.tensor([0]), torch.tensor([0])  # block_tables, context_lens

    # _prepare_for_continuous_batching (base.py:492-587) dispatches as c8d6bdc's does

    def _token_rows(self, input_ids, cache_ids, seq_ids):
        """The one-token branch (:575-587): scattered, so cache ids in another dtype than the inputs fail."""
        batch_size = self.neuron_config.continuous_batching.batch_size_for_shared_caches
        full_input_ids = torch.zeros(batch_size, 1, dtype=input_ids.dtype)
        full_cache_ids = torch.zeros(batch_size, 1, dtype=input_ids.dtype)
        full_seq_ids = torch.arange(batch_size, dtype=torch.int32)
        # vLLM v0.3.3 used to pass 1d seq_ids but starting with v0.4.0 that is no longer the case (the real comment)
        seq_ids_int64 = seq_ids.flatten().unsqueeze(-1).to(torch.int64)
        full_input_ids.scatter_(dim=0, index=seq_ids_int64, src=input_ids)
        full_cache_ids.scatter_(dim=0, index=seq_ids_int64, src=cache_ids)
        return full_input_ids, full_cache_ids, full_seq_ids

    def _preprocess(self, input_ids, start_ids=None, cache_ids=None, **kwargs):  # base.py:589-611
        input_ids, cache_ids, new_start_ids = self._prepare_for_continuous_batching(input_ids, cache_ids, start_ids)
        input_ids, cache_ids, last_token_id, block_tables, context_lens = self._prepare_for_par_ctx_rhs_padding(
            input_ids, cache_ids, start_ids, **kwargs
        )
        start_ids = new_start_ids
        batch_size, context_length = input_ids.shape
        if start_ids is None:
            start_ids = torch.zeros(batch_size, dtype=torch.int32)
        if cache_ids is None:
            cache_ids = torch.arange(context_length, dtype=torch.int32)
            if self.neuron_config.use_2d_cache_ids:
                cache_ids = cache_ids.unsqueeze(0).expand(batch_size, context_length)
        return input_ids, cache_ids, start_ids, last_token_id, block_tables, context_lens

    def _postprocess(self, input_ids, logits, start_ids=None, **kwargs):  # base.py:613-639
        if start_ids is None:
            return logits
        if not self.neuron_config.lhs_aligned or input_ids.shape[-1] > 1:
            return logits
        input_batch_size = start_ids.shape[0]
        seq_ids = start_ids.flatten()
        if torch.equal(seq_ids, torch.arange(input_batch_size)):
            return logits[:input_batch_size]
        return logits[seq_ids.to(torch.long)]


PREPROCESSING = {
    "7a30b42": Preprocess7a30b42,
    "0623de2": Preprocess0623de2,
    "c8d6bdc": PreprocessC8d6bdc,
    "1ade6d7": Preprocess1ade6d7,
}
