"""Stand-in of transformers_neuronx.fused_speculation (1ade6d7): FusedSpeculativeDecoder.

The real class compiles one graph that runs the draft k + 1 times (k speculated tokens, then one more
step so the draft's cache holds the last one whatever is accepted), the target once over k + 1
positions, and the token selection, all on device; `sample` loops over that graph on the host and
returns `(sequences, rate, iters)`: `rate[b][n]` counts iterations that committed n tokens. Here the
graph is a few lines of torch over the stand-in models; the constructor keeps the real signature and
assertions, and `sample` keeps the real loop's bookkeeping (positions, cache_ids, eos, clamping).
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
        assert target.neuron_config.on_device_generation is not None, (
            "The target model must enable on-device sampling."
        )
        assert target.config.vocab_size == draft.config.vocab_size, (
            "The target model and draft model must have the same vocab size."
        )
        assert target.decoder_lm_head.tp_degree == draft.decoder_lm_head.tp_degree, (
            "The target model and draft model must have the same tp degree."
        )
        assert isinstance(k, int), "The k value must be an integer."
        _standin.RUNTIME.record("fused", "FusedSpeculativeDecoder", k=k, pad_token_id=pad_token_id,
                                eos_token_id=eos_token_id)
        self.draft = draft
        self.target = target
        self.k = k
        self.pad_token_id = pad_token_id
        self.eos_token_id = eos_token_id
        self.output_scores = output_scores
        self.buckets = buckets if buckets is not None else target.decoder_lm_head.n_positions_list
        self.max_position = self.buckets[-1]
        self.vocab_size = target.config.vocab_size
        self.speculator = None

    def to_neuron(self, workers=None):
        _standin.RUNTIME.record("fused", "to_neuron", workers=workers)
        for model in (self.draft, self.target):
            model._require_device()
        self.speculator = True

    def sample(self, input_ids, start_ids=None, attention_mask=None, sequence_length=None, streamer=None):
        if sequence_length is None:
            sequence_length = self.max_position - self.k
        assert sequence_length <= self.max_position - self.k
        assert self.speculator is not None, "call to_neuron() first"
        batch_size, start = input_ids.shape
        cache_ids = torch.arange(start, dtype=torch.int32)
        token_id = self.target(input_ids, cache_ids=cache_ids, start_ids=start_ids)
        self.draft(input_ids, cache_ids=cache_ids, start_ids=start_ids)
        sequences = torch.full((batch_size, sequence_length + self.k + 1), self.pad_token_id, dtype=torch.int32)
        sequences[:, :start] = input_ids
        cache_ids = torch.full((batch_size, 1), start, dtype=torch.int32)
        positions = torch.arange(start + 1, start + self.k + 2, dtype=torch.int64).repeat((batch_size, 1))
        sequences.scatter_(1, torch.full((batch_size, 1), start, dtype=torch.int64), token_id.to(torch.int32))
        done = torch.full((batch_size, 1), False)
        ends = torch.full((batch_size,), sequence_length, dtype=torch.int32)
        batch_positions = torch.arange(self.k + 1).unsqueeze(0)
        batch_mask = torch.full((batch_size, self.k + 1), False)
        iters = torch.zeros(batch_size)
        rate = torch.zeros(batch_size, 10)
        while True:
            tokens, counts, token_id = self._iteration(token_id, int(cache_ids[0, 0]))
            iters[0] += 1
            rate[0][counts[0][0]] += 1
            if self.eos_token_id is not None:
                hits = [t for t in range(int(counts[0][0])) if int(tokens[0][t]) == self.eos_token_id]
                if hits:
                    ends[0] = int(cache_ids[0][0]) + hits[0] + 2
                    done[0] = True
                    batch_mask[0] = torch.greater(batch_positions, hits[0])
                tokens.masked_fill_(batch_mask, self.pad_token_id)
                if hits:
                    batch_mask.logical_or_(done)
            sequences.scatter_(1, positions, tokens)
            positions += counts
            cache_ids += counts
            cache_ids = torch.clamp(cache_ids, max=sequence_length)
            positions = torch.clamp(positions, max=sequence_length)
            done.logical_or_(torch.eq(cache_ids, sequence_length))
            if done.all().item():
                break
        return sequences[:, : ends.max().item()], rate, iters

    # ------------------------------------------------------------------ the fused graph, in torch

    def _iteration(self, token_id, cache_id):
        """k draft steps + 1 cache-filling step, the target over k + 1 positions, token selection."""
        drafted, draft_logits, token = [], [], token_id.view(1, 1)
        for step in range(self.k):
            logits = self.draft._write_and_score(token, [cache_id + step], [cache_id + step])
            token = self.draft.select_on_device(logits, self.draft.neuron_config.on_device_generation)
            drafted.append(int(token))
            draft_logits.append(logits[0])
        self.draft._write_and_score(token, [cache_id + self.k], [cache_id + self.k])
        window = torch.tensor([[int(token_id), *drafted]])
        slots = list(range(cache_id, cache_id + self.k + 1))
        target_logits = self.target._write_and_score(window, slots, slots)  # (k + 1, V)
        _standin.RUNTIME.record("fused", "iteration", cache_id=cache_id, window=window.view(-1).tolist())
        committed = self._select(drafted, torch.stack(draft_logits), target_logits)
        tokens = torch.full((1, self.k + 1), self.pad_token_id, dtype=torch.int32)
        tokens[0, : len(committed)] = torch.tensor(committed, dtype=torch.int32)
        return tokens, torch.tensor([[len(committed)]]), torch.tensor([[committed[-1]]], dtype=torch.int32)

    def _select(self, drafted, draft_logits, target_logits):
        generation = self.target.neuron_config.on_device_generation
        if not generation.do_sample:
            best = target_logits.argmax(-1).tolist()
            n = 0
            while n < self.k and drafted[n] == best[n]:
                n += 1
            return [*drafted[:n], best[n]]
        q = (draft_logits / generation.temperature).softmax(-1)
        p = (target_logits / generation.temperature).softmax(-1)
        for i, token in enumerate(drafted):
            if torch.rand(()) >= (p[i, token] / q[i, token]).clamp(max=1.0):
                residual = (p[i] - q[i]).clamp(min=0.0)
                return [*drafted[:i], int(torch.multinomial(residual / residual.sum(), 1))]
        return [*drafted, int(torch.multinomial(p[self.k], 1))]
