"""Stand-in of transformers_neuronx.speculation: acceptor, draft provider and the speculative loop.

Ports of the real logic of both API generations (test code, kept close to the source so our
adapters meet the same shapes): before SDK 2.21 the acceptor sees unbatched scores and returns the
accepted tokens; from SDK 2.21 it sees (bs, ...) tensors and returns a zero-padded (bs, k) tensor,
and the loop counts the accepted tokens with count_nonzero.
"""

from __future__ import annotations

import torch

from transformers_neuronx import _standin, base, sampling


class TokenAcceptor:
    def __call__(self, draft_ids, draft_scores, target_scores):
        raise NotImplementedError(
            f"{self.__class__} is an abstract class. Only classes inheriting this class can be called."
        )


class DraftProvider:
    def __call__(self, input_ids, k, cache_ids=None, start_ids=None):
        raise NotImplementedError(
            f"{self.__class__} is an abstract class. Only classes inheriting this class can be called."
        )


class DefaultTokenAcceptor(TokenAcceptor):
    """Rejection sampling on plain softmax probabilities (no temperature / top-k / top-p)."""

    def __call__(self, draft_ids, draft_scores, target_scores):
        batched = draft_scores.dim() == 3
        scores_d = draft_scores[0] if batched else draft_scores
        scores_t = target_scores[0] if batched else target_scores
        ids = draft_ids.view(-1)
        q = scores_d.softmax(-1)
        p = scores_t.softmax(-1)
        rows = torch.arange(ids.shape[0])
        accepted = torch.rand(ids.shape[0]) < (p[rows, ids] / q[rows, ids]).clamp(max=1.0)
        rejected = (~accepted).nonzero()
        if rejected.numel():
            index = int(rejected[0])
            residual = (p[index] - q[index]).clamp(min=0.0)
            tokens = torch.cat([ids[:index], torch.multinomial(residual, 1)])
        else:
            tokens = torch.cat([ids, torch.multinomial(p[-1], 1)])
        if not batched:
            return tokens.view(1, -1)
        padded = torch.zeros(1, scores_t.shape[0], dtype=torch.int64)
        padded[0, : tokens.shape[0]] = tokens
        return padded


class DraftModelForSpeculation(DraftProvider):
    """Drafts greedily (argmax) with a Neuron model, one forward call per token."""

    def __init__(self, model, **kwargs):
        self.model = model
        self.kwargs = kwargs

    def __call__(self, input_ids, k, cache_ids=None, start_ids=None):
        start_len = int(cache_ids.reshape(-1)[0]) if cache_ids is not None else 0
        if start_len == 0:  # context encoding
            scores = self.model(input_ids, cache_ids, start_ids)
            return torch.argmax(scores, dim=1, keepdim=True), scores
        scores = self.model(input_ids, cache_ids, start_ids)
        tokens, rows = [], []
        for cur_len in range(start_len, start_len + k):
            token = torch.argmax(scores, keepdim=True, dim=1)
            rows.append(scores)
            tokens.append(token)
            if cur_len + 1 >= start_len + k:
                break
            scores = self.model(token, torch.as_tensor([cur_len + 1], dtype=torch.int32), start_ids)
        if _standin.API == "sdk_2_18":
            return torch.cat(tokens, dim=1), torch.cat(rows, dim=0)  # (1, k), (k, V)
        return torch.cat(tokens, dim=1), torch.stack(rows)  # (1, k), (k, bs, V)


class SpeculativeGenerator:
    def __init__(self, draft, target, k=4, acceptor=None):
        if isinstance(draft, base.NeuronModelBase):
            draft = DraftModelForSpeculation(draft)
        self.draft = draft
        self.target = target
        self.k = k
        self.acceptor = acceptor or DefaultTokenAcceptor()

    if _standin.API == "sdk_2_18":

        def sample(self, input_ids, sequence_length, start_ids=None, eos_token_id=None, streamer=None):
            return self._sample_2_18(input_ids, sequence_length, start_ids, eos_token_id, streamer)
    else:

        def sample(
            self,
            input_ids,
            sequence_length,
            start_ids=None,
            eos_token_id=None,
            pad_token_id=0,
            attention_mask=None,
            streamer=None,
            output_logits=False,
        ):
            return self._sample_2_21(input_ids, sequence_length, start_ids, eos_token_id, pad_token_id, streamer)

    def _sample_2_18(self, input_ids, sequence_length, start_ids, eos_token_id, streamer):
        """Variable-length acceptor results; a plain greedy `target.sample` finishes the last k tokens."""
        _, start = input_ids.shape
        self.draft(input_ids, self.k, None, start_ids)
        target_next_id = sampling.select_tokens(self.target(input_ids, None, start_ids))
        if streamer:
            streamer.put(target_next_id)
        done = torch.full((1, 1), False)
        eos = torch.tensor(eos_token_id) if eos_token_id is not None else None
        tokens = [input_ids, target_next_id]
        current = start
        while True:
            if eos is not None:
                done |= target_next_id == eos
                if done.all():
                    break
            draft_ids, draft_scores = self.draft(
                target_next_id, self.k - 1, torch.tensor([current], dtype=torch.int32), start_ids
            )
            cache_ids = torch.arange(current, current + draft_ids.shape[1] + 1)
            window = torch.cat([target_next_id, draft_ids], dim=1)
            target_scores = self.target.speculative_forward(
                input_ids=window, cache_ids=cache_ids, start_ids=start_ids, speculation_length=self.k
            )
            accepted = self.acceptor(draft_ids, draft_scores, target_scores.squeeze(dim=-1))
            if accepted.dim() != 2:
                accepted = accepted.view(1, -1)
            _, num_accepted = accepted.shape
            if sequence_length - num_accepted < self.k:
                accepted = accepted[:, : sequence_length - len(tokens)]
            for index in range(num_accepted):
                token = accepted[:, index : index + 1]
                if eos is not None:
                    done |= token == eos
                current += 1
                tokens.append(token)
                if streamer:
                    streamer.put(token)
                if current >= sequence_length - 1 or (eos is not None and done.all()):
                    if streamer:
                        streamer.end()
                    return torch.cat(tokens, dim=-1)
            target_next_id = accepted[:, -1:]
            if num_accepted == self.k:
                self.draft(accepted[:, -2:-1], 1, torch.tensor([current - 1]), start_ids)
            if current >= sequence_length - 1 - self.k:
                rest = self.target.sample(
                    target_next_id,
                    sequence_length=sequence_length,
                    cache_ids=torch.tensor([current], dtype=torch.int32),
                    top_k=1,
                )
                tokens.append(rest[:, 1:])
                break
        if streamer:
            streamer.end()
        return torch.cat(tokens, dim=-1)

    def _sample_2_21(self, input_ids, sequence_length, start_ids, eos_token_id, pad_token_id, streamer):
        """Zero-padded (bs, k) acceptor results counted with count_nonzero; batch 1 here."""
        batch_size, context_len = input_ids.shape
        self.draft(input_ids, self.k, None, start_ids)
        target_scores = self.target(input_ids, None, start_ids)
        if streamer:
            streamer.put(input_ids)
        target_next_ids = sampling.select_tokens(target_scores)
        if streamer:
            streamer.put(target_next_ids)
        done = torch.full((batch_size, 1), False)
        early_stop = eos_token_id is not None
        eos = torch.tensor(eos_token_id, dtype=torch.int64) if early_stop else None
        tokens = torch.full((batch_size, sequence_length + self.k + 1), pad_token_id, dtype=torch.int64)
        tokens.scatter_(1, torch.arange(context_len).repeat((batch_size, 1)), input_ids.to(torch.int64))
        end_positions = torch.tensor([context_len], dtype=torch.int64)
        cache_ids = end_positions.clone()
        tokens.scatter_(1, end_positions.view(-1, 1), target_next_ids)
        end_positions += 1
        k_range = torch.arange(self.k, dtype=torch.int64).repeat((batch_size, 1))
        while True:
            if early_stop:
                done |= target_next_ids == eos
            if done.all():
                break
            draft_ids, draft_scores = self.draft(target_next_ids, self.k - 1, cache_ids, start_ids)
            target_cache_ids = torch.arange(cache_ids[0], cache_ids[0] + draft_ids.shape[1] + 1)
            window = torch.cat([target_next_ids, draft_ids], dim=1)
            target_scores = self.target.speculative_forward(
                input_ids=window, cache_ids=target_cache_ids, start_ids=start_ids, speculation_length=self.k
            )
            draft_scores = torch.transpose(draft_scores, 0, 1)  # (bs, k-1, V)
            target_scores = torch.transpose(torch.transpose(target_scores, 0, 2), 1, 2)  # (bs, k, V)
            accepted = self.acceptor(draft_ids, draft_scores, target_scores)
            lengths = torch.count_nonzero(accepted, dim=1)
            update_positions = k_range + end_positions.view(-1, 1)
            if early_stop:
                eos_mask = (accepted == eos_token_id).cumsum(1).bool() | done.view(-1, 1)
                accepted[eos_mask] = eos_token_id
            tokens.scatter_(1, update_positions, accepted)
            cache_ids += lengths
            end_positions += lengths
            target_next_ids = accepted[:, lengths - 1]
            if streamer:
                streamer.put(accepted)
            if early_stop:
                done |= eos_mask.any(dim=1).view(-1, 1)
            if (lengths == self.k).any():
                self.draft(accepted[:, -2:-1], 1, cache_ids - 1, start_ids)
            end_positions = torch.clamp(end_positions, max=sequence_length)
            cache_ids = torch.clamp(cache_ids, max=sequence_length)
            done.logical_or_(torch.eq(cache_ids, sequence_length).unsqueeze(1))
        if streamer:
            streamer.end()
        return tokens[:, :sequence_length]
