"""Stand-in of transformers_neuronx.fused_speculation (1ade6d7): FusedSpeculativeDecoder.

The real class compiles one graph that runs the draft k + 1 times (k speculated tokens, then one more
step so the draft's cache holds the last one whatever is accepted), the target once over k + 1
positions, and the token selection, all on device, for every row of the batch from its own cache_ids
(:150-214); `sample` loops over that graph on the host (`self.speculator.execute`, :677) and returns
`(sequences, rate, iters)`. Here the graph (`_Speculator`) is a few lines of torch over the stand-in models;
the constructor keeps the real signature and assertions, and `sample` is the real loop (:546-742) statement
for statement without the EAGLE, output_scores and debug branches: right-padded prompts with their
attention_mask at batch > 1, each row's first token at its count of ones, per-row EOS and clamping, and
`rate[batch][counts[0][0]]` (:683), which counts row 0's tokens for every row. The continuous-batching entry is
ported the same way (without EAGLE and debug): `speculative_iteration` (:746-867) with `prepare_cache_ids`,
`preprocess_input`, `postprocess_output` (:871-936) and `speculative_iteration_post_process` (:220-234), which
rewrites every token equal to pad_token_id into row 0's first token before it cuts each row at its count.
Only in the SDK 2.21 generation, like the real module.
"""

import torch

from transformers_neuronx import _standin

if _standin.API == "sdk_2_18":
    raise ImportError("No module named 'transformers_neuronx.fused_speculation' (it first ships with SDK 2.21)")


class FusedSpeculativeDecoder(torch.nn.Module):
    def __init__(
        self,
        draft,
        target,
        k: int = 2,
        pad_token_id: int = 0,
        eos_token_id=None,
        buckets=None,
        output_scores=False,
        deterministic_threshold=None,
        debug=False,
        simulation_acceptance_length=None,
    ) -> None:
        super().__init__()
        assert draft.neuron_config.on_device_embedding == True, (  # noqa: E712 (as in the source)
            "The draft model must enable on-device embedding."
        )
        assert draft.neuron_config.on_device_generation is not None, "The draft model must enable on-device sampling."
        assert target.neuron_config.on_device_embedding == True, (  # noqa: E712
            "The target model must enable on-device embedding."
        )
        assert target.neuron_config.on_device_generation is not None, "The target model must enable on-device sampling."
        assert target.config.vocab_size == draft.config.vocab_size, (
            "The target model and draft model must have the same vocab size."
        )
        assert target.decoder_lm_head.tp_degree == draft.decoder_lm_head.tp_degree, (
            "The target model and draft model must have the same tp degree."
        )
        assert isinstance(k, int), "The k value must be an integer."
        if draft.batch_sizes != [1]:
            assert draft.neuron_config.padding_side == "right", (
                "The draft model must set padding_side as right for batch size > 1."
            )
        if target.batch_sizes != [1]:
            assert target.neuron_config.padding_side == "right", (
                "The target model must set padding_side as right for batch size > 1."
            )
        _standin.RUNTIME.record(
            "fused", "FusedSpeculativeDecoder", k=k, pad_token_id=pad_token_id, eos_token_id=eos_token_id
        )
        self.draft = draft
        self.target = target
        self.k = k
        self.pad_token_id = pad_token_id
        self.eos_token_id = eos_token_id
        self.output_scores = output_scores
        self.buckets = buckets if buckets is not None else target.decoder_lm_head.n_positions_list
        self.batch_sizes = target.batch_sizes
        self.max_position = self.buckets[-1]
        self.vocab_size = target.config.vocab_size
        self.speculator = None

    def to_neuron(self, workers=None):
        _standin.RUNTIME.record("fused", "to_neuron", workers=workers)
        for model in (self.draft, self.target):
            model._require_device()
        self.speculator = _Speculator(self)

    def sample(self, input_ids, start_ids=None, attention_mask=None, sequence_length=None, streamer=None):
        if sequence_length is None:
            sequence_length = self.max_position - self.k
        assert sequence_length <= self.max_position - self.k
        batch_size, start = input_ids.shape
        if start_ids is None:
            start_ids = torch.arange(batch_size)
        if batch_size > 1:
            assert attention_mask is not None, (
                "The attention mask needs to be provided for speculation where batch_size>1"
            )
            cache_ids = torch.arange(start).reshape(1, start).expand(batch_size, start).mul(attention_mask)
        else:
            cache_ids = torch.arange(start, dtype=torch.int32)
            if self.target.neuron_config.use_2d_cache_ids:
                cache_ids = cache_ids.unsqueeze(0).expand(batch_size, start)
        if streamer:
            streamer.put(input_ids)
        token_id = self.target(input_ids, cache_ids=cache_ids, start_ids=start_ids)
        if streamer:
            streamer.put(token_id)
        self.draft(input_ids, cache_ids=cache_ids, start_ids=start_ids)
        sequences = torch.full((batch_size, sequence_length + self.k + 1), self.pad_token_id, dtype=torch.int32)
        sequences[:, :start] = input_ids
        if batch_size > 1:
            cache_ids = torch.count_nonzero(attention_mask, dim=1).view(-1, 1)
            positions = torch.count_nonzero(attention_mask, dim=1).view(-1, 1) + torch.arange(
                self.k + 1, dtype=torch.int64
            ).repeat((batch_size, 1))
            sequences.scatter_(1, torch.count_nonzero(attention_mask, dim=1).view(-1, 1), token_id)  # :600, no cast
            positions = positions + 1
        else:
            cache_ids = torch.full((batch_size, 1), start, dtype=torch.int32)
            positions = torch.arange(start + 1, start + self.k + 2, dtype=torch.int64).repeat((batch_size, 1))
            sequences.scatter_(1, torch.full((batch_size, 1), start, dtype=torch.int64), token_id)  # :605, no cast
        done = torch.full((batch_size, 1), False)
        ends = torch.full((batch_size,), sequence_length, dtype=torch.int32)
        batch_positions = torch.arange(self.k + 1).unsqueeze(0)
        batch_mask = torch.full((batch_size, self.k + 1), False)
        eos_token = None
        if self.eos_token_id is not None:
            eos_token = torch.tensor(self.eos_token_id, dtype=torch.int32)
        sequence_length = torch.tensor(sequence_length, dtype=torch.int32)
        accepts = 0
        iters = torch.zeros(batch_size)
        rate = torch.zeros(batch_size, 10)
        while True:
            coverted_cache_ids = cache_ids.squeeze(1) if not self.target.neuron_config.use_2d_cache_ids else cache_ids
            tokens, counts, token_id, *score = self.speculator.execute(
                token_id, coverted_cache_ids, start_ids, return_ranks=1
            )
            for batch in range(batch_size):
                if not done[batch]:
                    accepts += counts
                    iters[batch] += 1
                    rate[batch][counts[0][0]] += 1
            if eos_token is not None:
                finished = []
                for batch in range(batch_size):
                    for t in range(counts[batch][0]):
                        if tokens[batch][t] == eos_token:
                            finished.append([batch, t])
                finished = torch.tensor(finished)
                if finished.numel():
                    sequence, position = finished[:, 0], finished[:, 1]
                    for seq, pos in zip(sequence, position, strict=True):
                        ends[seq] = cache_ids[seq][0].int() + pos.int() + 2
                        done[seq] = True
                        batch_mask[seq] = torch.greater(batch_positions, pos)
                tokens.masked_fill_(batch_mask, self.pad_token_id)
                if finished.numel():
                    batch_mask.logical_or_(done)
            if streamer:
                streamer.put(tokens)
            sequences.scatter_(1, positions, tokens)
            positions += counts
            cache_ids += counts
            cache_ids = torch.clamp(cache_ids, max=sequence_length)
            positions = torch.clamp(positions, max=sequence_length)
            done.logical_or_(torch.eq(cache_ids, sequence_length))
            if done.all().item():
                break
        if streamer:
            streamer.end()
        return sequences[:, : ends.max().item()], rate, iters

    def speculative_iteration(self, input_ids, cache_ids, start_ids):  # :746-867, without EAGLE and debug
        batch_size, context_len = input_ids.shape
        cache_ids = self.prepare_cache_ids(cache_ids, batch_size, context_len)
        min_values_per_row, _ = torch.min(cache_ids, dim=-1)
        do_context_decoding = (min_values_per_row == 0).any()
        if do_context_decoding:
            target_next_id = self.target(input_ids, cache_ids, start_ids).reshape(batch_size, -1)
            self.draft(input_ids, cache_ids, start_ids)
            return target_next_id, torch.tensor([[1]] * batch_size)
        seq_ids = start_ids.flatten().to(torch.long)
        graph_batch_size = self.batch_sizes[0]
        full_input_ids, cache_ids_pad = [
            self.preprocess_input(tensor=t, seq_ids=seq_ids, target_batch_size=graph_batch_size)
            for t in [input_ids, cache_ids]
        ]
        seq_ids_pad = torch.arange(graph_batch_size)
        tokens, counts, token_id, *score = self.speculator.execute(
            full_input_ids, cache_ids_pad, seq_ids_pad, return_ranks=1
        )
        output_tokens, output_counts = [self.postprocess_output(tensor=t, seq_ids=seq_ids) for t in [tokens, counts]]
        return self.speculative_iteration_post_process(output_tokens, output_counts)

    def speculative_iteration_post_process(self, output_tokens, output_counts):  # :220-234 (FusedSpeculativeBase)
        non_pad_value = output_tokens[0, 0]
        output_tokens[output_tokens == self.pad_token_id] = non_pad_value
        result_tokens = torch.full_like(output_tokens, fill_value=self.pad_token_id)
        for i in range(output_tokens.size(0)):
            result_tokens[i, : output_counts[i].item()] = output_tokens[i, : output_counts[i].item()]
        return result_tokens, output_counts

    def preprocess_input(self, tensor, seq_ids, target_batch_size):  # :871-894
        original_shape = tensor.shape
        new_shape = (target_batch_size,) + original_shape[1:]
        output_tensor = torch.zeros(new_shape, dtype=tensor.dtype)
        output_tensor[seq_ids] = tensor
        return output_tensor

    def postprocess_output(self, tensor, seq_ids):  # :897-915
        return tensor[seq_ids]

    def prepare_cache_ids(self, cache_ids, batch, seq_len):  # :918-936
        if cache_ids is not None:
            return cache_ids
        if self.target.neuron_config and self.target.neuron_config.use_2d_cache_ids:
            return torch.tensor([[j for j in range(seq_len)] for i in range(batch)])
        return torch.tensor([i for i in range(seq_len)])


class _Speculator:
    """The compiled fused graph, in torch: per row, k draft steps + 1 cache-filling step from the row's own cache
    id, the target over k + 1 positions, and the token selection (pad_token_id after the accepted ones)."""

    def __init__(self, decoder):
        self.decoder = decoder

    def execute(self, token_id, cache_ids, start_ids, return_ranks=1):
        """Each batch line drafts, scores and selects on the cache row its start id (sequence id) names."""
        decoder = self.decoder
        positions = cache_ids.reshape(token_id.shape[0], -1)[:, 0].tolist()
        lines = zip(start_ids.view(-1).tolist(), token_id.view(-1).tolist(), positions, strict=True)
        rows = [self._row(int(row), int(token), int(position)) for row, token, position in lines]
        tokens = torch.full((len(rows), decoder.k + 1), decoder.pad_token_id, dtype=torch.int32)
        for row, committed in enumerate(rows):
            tokens[row, : len(committed)] = torch.tensor(committed, dtype=torch.int32)
        counts = torch.tensor([[len(committed)] for committed in rows])
        return [tokens, counts, torch.tensor([[committed[-1]] for committed in rows], dtype=torch.int32)]

    def _row(self, row, token_id, cache_id):
        decoder = self.decoder
        drafted, draft_logits, token = [], [], token_id
        for step in range(decoder.k):
            logits = _score(decoder.draft, row, [token], [cache_id + step])
            token = int(decoder.draft.select_on_device(logits, decoder.draft.neuron_config.on_device_generation))
            drafted.append(token)
            draft_logits.append(logits[0])
        _score(decoder.draft, row, [token], [cache_id + decoder.k])
        window = [token_id, *drafted]
        target_logits = _score(decoder.target, row, window, list(range(cache_id, cache_id + decoder.k + 1)))
        _standin.RUNTIME.record("fused", "iteration", row=row, cache_id=cache_id, window=window)
        return self._select(drafted, torch.stack(draft_logits), target_logits)

    def _select(self, drafted, draft_logits, target_logits):
        k = self.decoder.k
        generation = self.decoder.target.neuron_config.on_device_generation
        if not generation.do_sample:
            best = target_logits.argmax(-1).tolist()
            n = 0
            while n < k and drafted[n] == best[n]:
                n += 1
            return [*drafted[:n], best[n]]
        q = (draft_logits / generation.temperature).softmax(-1)
        p = (target_logits / generation.temperature).softmax(-1)
        for i, token in enumerate(drafted):
            if torch.rand(()) >= (p[i, token] / q[i, token]).clamp(max=1.0):
                residual = (p[i] - q[i]).clamp(min=0.0)
                return [*drafted[:i], int(torch.multinomial(residual / residual.sum(), 1))]
        return [*drafted, int(torch.multinomial(p[k], 1))]


def _score(model, row, tokens, positions):
    """Logits (n, V) of `tokens` written at `positions` of the model's cache row `row`, each reading the cache
    below the first position and the tokens before it (the stand-in model's 1-D or 2-D layout)."""
    if model.neuron_config.use_2d_cache_ids:
        return model._run_row(row, tokens, positions, positions[0], list(range(len(tokens))))
    return model._write_and_score(tokens, positions, positions)
