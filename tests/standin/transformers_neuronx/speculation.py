"""Stand-in of transformers_neuronx.speculation: acceptor, draft provider and the speculative loop.

Ports of the real logic of both API generations (test code, kept close to the source so our
adapters meet the same shapes): before SDK 2.21 the acceptor sees unbatched scores and returns the
accepted tokens, and the loop refuses batch > 1 (7a30b42 speculation.py:345-347); from SDK 2.21 it sees
(bs, ...) tensors and returns a zero-padded (bs, k) tensor, and the loop counts the accepted tokens with
count_nonzero. The 1ade6d7 loop (`_sample_2_21`, speculation.py:718-867), its draft provider (:312-365) and
its acceptor (:231-283) are ported statement for statement, batch > 1 included, with what they do to rows
that move differently: the next window of every row starts from the token at ROW 0's accepted length
(:836-838), and the draft puts every row's 2nd..(k-1)th token at row 0's positions (:335, :356).
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

    if _standin.API == "sdk_2_18":

        def __call__(self, draft_ids, draft_scores, target_scores):
            ids = draft_ids.view(-1)
            q = draft_scores.softmax(-1)
            p = target_scores.softmax(-1)
            rows = torch.arange(ids.shape[0])
            accepted = torch.rand(ids.shape[0]) < (p[rows, ids] / q[rows, ids]).clamp(max=1.0)
            rejected = (~accepted).nonzero()
            if rejected.numel():
                index = int(rejected[0])
                residual = (p[index] - q[index]).clamp(min=0.0)
                return torch.cat([ids[:index], torch.multinomial(residual, 1)]).view(1, -1)
            return torch.cat([ids, torch.multinomial(p[-1], 1)]).view(1, -1)
    else:

        def __call__(self, draft_ids, draft_scores, target_scores):  # 1ade6d7 speculation.py:231-283
            batch_size, draft_token_len, draft_vocab = draft_scores.shape
            batch_size, target_token_len, target_vocab = target_scores.shape
            assert draft_vocab == target_vocab
            assert draft_token_len + 1 == target_token_len
            accepted_tokens = torch.zeros(batch_size, target_token_len, dtype=torch.int64)
            draft_probabilities = torch.softmax(draft_scores, dim=-1)
            target_probabilities = torch.softmax(target_scores, dim=-1)
            index = torch.reshape(draft_ids, (1, draft_token_len, batch_size))
            target_probs = torch.gather(target_probabilities[:, :-1], -1, index)
            draft_probs = torch.gather(draft_probabilities, -1, index)
            target_probs = target_probs.squeeze(0)
            draft_probs = draft_probs.squeeze(0)
            random = torch.rand(draft_probs.shape)
            ratio = torch.clamp(target_probs / draft_probs, max=1.0)
            accepted = torch.less(random, ratio)
            minimum = torch.min(accepted.view(torch.uint8), dim=0)
            values = minimum.values
            indices = minimum.indices

            def sample(probs):
                return torch.multinomial(probs, num_samples=1, replacement=True)

            for batch_dim in range(batch_size):
                if values[batch_dim] != 0:
                    next_token = sample(target_probabilities[batch_dim, -1:])
                    tokens = torch.cat((draft_ids[batch_dim], next_token[0]), dim=-1)
                    positions = torch.arange(target_token_len)
                else:
                    index = indices[batch_dim]
                    prob_diff = (
                        target_probabilities[batch_dim, index : index + 1]
                        - draft_probabilities[batch_dim, index : index + 1]
                    )
                    prob_diff = torch.clamp(prob_diff, min=0.0)
                    next_token = sample(prob_diff)
                    tokens = torch.cat((draft_ids[batch_dim, :index], next_token[0]), dim=-1)
                    positions = torch.arange(tokens.shape[0])
                accepted_tokens[batch_dim].scatter_(0, positions, tokens)
            return accepted_tokens


class DraftModelForSpeculation(DraftProvider):
    """Drafts greedily (argmax) with a Neuron model, one forward call per token."""

    def __init__(self, model, **kwargs):
        self.model = model
        self.kwargs = kwargs

    def _context_block(self, input_ids, cache_ids, start_ids):
        next_token_scores = self.model(input_ids, cache_ids, start_ids)
        return torch.argmax(next_token_scores, dim=1, keepdim=True), next_token_scores

    if _standin.API == "sdk_2_18":

        def __call__(self, input_ids, k, cache_ids=None, start_ids=None):
            start_len = int(cache_ids.reshape(-1)[0]) if cache_ids is not None else 0
            if start_len == 0:
                return self._context_block(input_ids, None, start_ids)
            scores = self.model(input_ids, cache_ids, start_ids)
            tokens, rows = [], []
            for cur_len in range(start_len, start_len + k):
                token = torch.argmax(scores, keepdim=True, dim=1)
                rows.append(scores)
                tokens.append(token)
                if cur_len + 1 >= start_len + k:
                    break
                scores = self.model(token, torch.as_tensor([cur_len + 1], dtype=torch.int32), start_ids)
            return torch.cat(tokens, dim=1), torch.cat(rows, dim=0)  # (1, k), (k, V)
    else:

        def __call__(self, input_ids, k, cache_ids=None, start_ids=None):  # 1ade6d7 speculation.py:312-365
            start_len = 0
            batch_size, _ = input_ids.shape
            if cache_ids is not None:
                start_len = cache_ids.item() if cache_ids.dim() == 1 else cache_ids[0][0]
            if start_len == 0:
                return self._context_block(input_ids, cache_ids, start_ids)
            next_token_scores = self.model(input_ids, cache_ids, start_ids)
            scores = []
            tokens = []
            for cur_len in range(start_len, start_len + k):
                next_len = cur_len + 1
                inputs = torch.argmax(next_token_scores, keepdim=True, dim=1)
                scores.append(next_token_scores)
                tokens.append(inputs)
                if next_len >= start_len + k:
                    break
                cache_ids = torch.as_tensor([next_len] * batch_size, dtype=torch.int32)  # row 0's position, all rows
                if batch_size > 1:
                    cache_ids = cache_ids.reshape(batch_size, 1)
                next_token_scores = self.model(inputs, cache_ids, start_ids)
            return torch.cat(tokens, dim=1), torch.stack(scores)  # (bs, k), (k, bs, V)


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
            return self._sample_2_21(
                input_ids,
                sequence_length,
                start_ids,
                eos_token_id,
                pad_token_id,
                attention_mask,
                streamer,
                output_logits,
            )

    def _sample_2_18(self, input_ids, sequence_length, start_ids, eos_token_id, streamer):
        """Variable-length acceptor results; a plain greedy `target.sample` finishes the last k tokens."""
        batch_size, start = input_ids.shape
        if batch_size > 1:
            raise NotImplementedError("Current speculative sampling loop supported only with batch size = 1.")
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

    def _sample_2_21(
        self, input_ids, sequence_length, start_ids, eos_token_id, pad_token_id, attention_mask, streamer, output_logits
    ):
        """1ade6d7 speculation.py:718-867, statement for statement."""
        batch_size, context_len = input_ids.shape
        cache_ids = None
        draft_logits, target_logits = [], []
        if batch_size > 1:
            assert attention_mask is not None, (
                "The attention mask needs to be provided for speculation where batch_size>1"
            )
            cache_ids = (
                torch.arange(context_len).reshape(1, context_len).expand(batch_size, context_len).mul(attention_mask)
            )
            if start_ids is None:
                start_ids = torch.arange(batch_size)
        _draft_ids, _draft_scores = self.draft(input_ids, self.k, cache_ids, start_ids)
        target_scores = self.target(input_ids, cache_ids, start_ids)
        if output_logits:
            target_logits.append(target_scores.unsqueeze(1))
        if streamer:
            streamer.put(input_ids)
        target_next_ids = sampling.select_tokens(target_scores)
        if streamer:
            streamer.put(target_next_ids)
        done_flags = torch.full((batch_size, 1), False)
        early_stop = False
        if eos_token_id is not None:
            eos_token = torch.tensor(eos_token_id, dtype=torch.int64)
            early_stop = True
        tokens = torch.full((batch_size, sequence_length + self.k + 1), pad_token_id, dtype=torch.int64)
        input_ids = input_ids.to(dtype=torch.int64)
        update_positions = torch.arange(context_len, dtype=torch.int64).repeat((batch_size, 1))
        tokens.scatter_(1, update_positions, input_ids)
        end_positions = torch.tensor([context_len], dtype=torch.int64)
        if attention_mask is not None:
            end_positions = torch.count_nonzero(attention_mask, dim=1)
        cache_ids = end_positions.clone().detach()
        tokens.scatter_(1, end_positions.view(-1, 1), target_next_ids)
        end_positions += 1
        k_arange_tensor = torch.arange(self.k, dtype=torch.int64).repeat((batch_size, 1))
        while True:
            if early_stop:
                done_flags |= target_next_ids == eos_token
                if batch_size > 1:
                    target_next_ids[done_flags] = eos_token
            if done_flags.all():
                break
            draft_cache_ids = cache_ids
            if batch_size > 1:
                draft_cache_ids = draft_cache_ids.view(-1, 1)
            draft_ids, draft_next_scores = self.draft(target_next_ids, self.k - 1, draft_cache_ids, start_ids)
            if batch_size == 1:
                target_cache_ids = torch.arange(cache_ids[0], cache_ids[0] + draft_ids.shape[1] + 1)
            else:
                target_cache_ids = k_arange_tensor + cache_ids.view(-1, 1)
            target_input_ids = torch.cat([target_next_ids, draft_ids], dim=1)
            target_next_scores = self.target.speculative_forward(
                input_ids=target_input_ids, cache_ids=target_cache_ids, start_ids=start_ids, speculation_length=self.k
            )
            draft_next_scores = torch.transpose(draft_next_scores, 0, 1)
            target_next_scores = torch.transpose(target_next_scores, 0, 2)
            target_next_scores = torch.transpose(target_next_scores, 1, 2)
            accepted_tokens = self.acceptor(draft_ids, draft_next_scores, target_next_scores)
            if output_logits:
                draft_logits.append(draft_next_scores)
                target_logits.append(target_next_scores)
            actual_accepted_tokens_lengths = torch.count_nonzero(accepted_tokens, dim=1)
            update_positions = k_arange_tensor + end_positions.view(-1, 1)
            if early_stop:
                eos_mask = (accepted_tokens == eos_token_id).cumsum(1).bool()
                eos_mask |= done_flags.view(-1, 1)
                accepted_tokens[eos_mask] = eos_token_id
            tokens.scatter_(1, update_positions, accepted_tokens)
            cache_ids += actual_accepted_tokens_lengths
            end_positions += actual_accepted_tokens_lengths
            target_next_ids = accepted_tokens[:, actual_accepted_tokens_lengths - 1]  # (bs, bs): row 0's length
            if batch_size > 1:
                target_next_ids = target_next_ids[:, 0].view(-1, 1)
            if streamer:
                streamer.put(accepted_tokens)
            if early_stop:
                done_flags |= eos_mask.any(dim=1).view(-1, 1)
            if (actual_accepted_tokens_lengths == self.k).any():
                draft_tokens = accepted_tokens[:, -2:-1]
                draft_cache_ids = cache_ids - 1
                if batch_size > 1:
                    draft_cache_ids = draft_cache_ids.view(-1, 1)
                self.draft(draft_tokens, 1, draft_cache_ids, start_ids)
            end_positions = torch.clamp(end_positions, max=sequence_length)
            cache_ids = torch.clamp(cache_ids, max=sequence_length)
            done_flags.logical_or_(torch.eq(cache_ids, sequence_length).unsqueeze(1))
        if streamer:
            streamer.end()
        if output_logits:
            return tokens[:, :sequence_length], draft_logits, target_logits
        return tokens[:, :sequence_length]
