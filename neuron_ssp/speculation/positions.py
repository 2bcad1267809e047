"""How many KV-cache slots one generation writes: the single rule behind the config check
(`neuron-ssp validate`) and the run-time check before the first call.

Our loop encodes the prompt into slots 0..P-1. Each later call scores the last committed token and
the drafts from that token's slot on, and the window never reaches past the token budget N, so the
last committed token is never scored: the target writes up to slot P+N-2, i.e. P+N-1 slots. The model
drafter runs one slot behind (its last draft token is never fed back): at most P+N-2 slots, and the
prompt's P. transformers-neuronx's own loop (`engine: library`) scores a full window of k from the
last committed slot, which it lets reach sequence_length-1: k slots more than ours. On NxD Inference every
target call (and, fused, every draft pass) is a padded k-wide window: k-1 slots more than ours.
"""

from __future__ import annotations

from neuron_ssp.errors import Problem, UsageError


def target_slots(prompt_len: int, max_new_tokens: int) -> int:
    return prompt_len + max_new_tokens - 1


def max_new_tokens_within(n_positions: int, prompt_len: int, extra_slots: int = 0) -> int:
    """The largest max_new_tokens whose target slots (plus an engine's `extra_slots`) fit the cache."""
    return n_positions - extra_slots - prompt_len + 1


def draft_slots(prompt_len: int, max_new_tokens: int) -> int:
    return max(prompt_len, prompt_len + max_new_tokens - 2)


def library_target_slots(prompt_len: int, max_new_tokens: int, k: int) -> int:
    return target_slots(prompt_len, max_new_tokens) + k


def padded_window_slots(prompt_len: int, max_new_tokens: int, k: int) -> int:
    """NxD Inference: every decoding call of the target is k wide (it has no one-token model), from the last
    committed slot (at most P+N-2) up to k-1 past it, and its bucket rule needs start + k <= n_positions
    (model_wrapper.py `_get_seq_bucket` at 4bcdc54b). The fused graph runs the draft over the same k slots."""
    return target_slots(prompt_len, max_new_tokens) + k - 1


def require_room(n_positions: int, needed: int, prompt_len: int, max_new_tokens: int, field: str) -> None:
    """Refuse before the first call, not when the cache overflows half-way."""
    if needed > n_positions:
        raise UsageError(Problem(
            field, n_positions,
            f"a prompt of {prompt_len} tokens and max_new_tokens {max_new_tokens} write {needed} cache "
            f"positions, more than the {n_positions} this model has",
            f"raise {field} to at least {needed} (within the model's limit), "
            "or shorten the prompt / lower --max-new-tokens"))
