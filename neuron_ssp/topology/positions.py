"""How many KV-cache slots one generation writes, per library, engine and model: the single rule behind
the config check (`neuron-ssp validate`), the server's admission check (`Pipeline.check_room`, its "send
max_tokens <= ..." hint) and each engine's own check before its first call. P is the prompt's length,
N max_new_tokens, k the window.

- native (our loop): the prompt fills slots 0..P-1; each call scores the last committed token and the
  drafts from that token's slot on, and the window never reaches past the token budget, so the last
  committed token is never scored: the target writes up to slot P+N-2, i.e. P+N-1 slots. The model
  drafter runs one slot behind (its last draft token is never fed back): P+N-2, and the prompt's P.
- library (transformers-neuronx's `SpeculativeGenerator`, speculation.py at 1ade6d7): with
  sequence_length S = P+N its loop runs while cache_ids < S, scores the window at cache_ids
  c..c+k-1 (line 800) and, after a fully accepted window, feeds the draft the last draft token at
  cache_ids - 1 = c+k-1 (lines 849-854), both before clamping: target and draft write up to slot
  S+k-2, i.e. P+N+k-1 slots each (at 7a30b42 the loop stops k earlier; the later rule covers both).
- fused (`FusedSpeculativeDecoder.sample`, fused_speculation.py at 1ade6d7 line 549): asserts
  sequence_length <= max_position - its k, its k being ours - 1: P+N+k-1 <= the target's n_positions.
  Its graph binds the draft's cache at the target's buckets (lines 163, 207, 347-349), so the draft
  needs at least the target's n_positions (`FUSED_DRAFT_RULE`), which covers its P+N+k-1.
- NxD Inference (`neuron.library: nxdi`), native and fused: every decoding call of the target is k wide
  (it has no one-token model), from the last committed slot (at most P+N-2) up to k-1 past it, and its
  bucket rule needs start + k <= n_positions (model_wrapper.py `_get_seq_bucket` at 4bcdc54b): P+N-2+k.
  The fused graph runs the draft over the same k slots. The NxDI backend carries that padding itself
  (`padding_slots`, which `engines.native.check_room` adds), so our loop needs no library switch.
"""

from __future__ import annotations

from neuron_ssp.config import Config
from neuron_ssp.errors import Problem, UsageError

TNX, NXDI = "transformers-neuronx", "nxdi"
FUSED_DRAFT_RULE = (
    "the fused graph is compiled for the target's buckets and binds the draft's KV cache at "
    "those sizes (fused_speculation.py _fused_hlo_with_standalone_draft)"
)


def slot_library(config: Config) -> str:
    """The library whose rule applies: `neuron.library` on Neuron; the torch backend pads nothing."""
    return config.neuron.library if config.platform.backend == "neuron" else TNX


def extra_target_slots(engine: str, k: int, library: str = TNX) -> int:
    """Slots a generation's target writes past our loop's P+N-1."""
    if library == NXDI:
        return k - 1
    return k if engine in ("library", "fused") else 0


def target_slots(prompt_len: int, max_new_tokens: int, engine: str = "native", k: int = 0, library: str = TNX) -> int:
    return prompt_len + max_new_tokens - 1 + extra_target_slots(engine, k, library)


def draft_slots(prompt_len: int, max_new_tokens: int, engine: str = "native", k: int = 0, library: str = TNX) -> int:
    if library == NXDI and engine == "fused":
        return target_slots(prompt_len, max_new_tokens, engine, k, library)
    if library == TNX and engine in ("library", "fused"):
        return prompt_len + max_new_tokens + k - 1
    return max(prompt_len, prompt_len + max_new_tokens - 2)


def slot_rule(engine: str, role: str, library: str = TNX) -> str:
    """The rule in words, for error messages: which slots `role` writes under `library` and `engine`."""
    if library == NXDI and (role == "target" or engine == "fused"):
        return "prompt + max_new_tokens - 2 + k (NxD Inference scores every window k wide)"
    if library == TNX and engine in ("library", "fused"):
        return f"prompt + max_new_tokens + k - 1 (engine: {engine})"
    return "prompt + max_new_tokens - 1" if role == "target" else "prompt + max_new_tokens - 2 (the prompt's at least)"


def max_new_tokens_within(n_positions: int, prompt_len: int, extra_slots: int = 0) -> int:
    """The largest max_new_tokens whose target slots (plus an engine's `extra_slots`) fit the cache."""
    return n_positions - extra_slots - prompt_len + 1


def max_prompt_within(n_positions: int, extra_slots: int = 0) -> int:
    """The longest prompt that leaves room for one new token: `max_new_tokens_within` >= 1."""
    return n_positions - extra_slots


def require_room(n_positions: int, needed: int, prompt_len: int, max_new_tokens: int, field: str) -> None:
    """Refuse before the first call, not when the cache overflows half-way."""
    if needed > n_positions:
        raise UsageError(
            Problem(
                field,
                n_positions,
                f"a prompt of {prompt_len} tokens and max_new_tokens {max_new_tokens} write {needed} cache "
                f"positions, more than the {n_positions} this model has",
                f"raise {field} to at least {needed} (within the model's limit), "
                "or shorten the prompt / lower --max-new-tokens",
            )
        )
