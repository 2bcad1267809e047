"""Stand-in of transformers_neuronx.sampling: only what the speculative loop uses."""

from __future__ import annotations

import torch


def select_tokens(next_token_scores, top_k=1, top_p=1.0, temperature=1.0):
    """top_k=1 (the loop's default) is greedy: the first token after the prompt is the target's argmax."""
    values, indices = torch.topk(next_token_scores, top_k, dim=-1)
    return torch.gather(indices, 1, torch.multinomial(values.softmax(-1), 1))
