"""The EAGLE-3 drafter: a head (eagle_head.py) drafts a chain from the target's own hidden states.

The loop asks the target for the taps of every row it scores for this request (base.HiddenStates) and hands
over those of the committed tokens (`take_hidden`). Position p pairs the target's taps at p with the token at
p + 1 (eagle_head.py). Before drafting, the head catches up in ONE call on every position whose taps arrived
since its last draft (the prompt, then each step's accepted tokens and the target's own token): the output at
the last of them gives the first draft token; each later token is one more head call on the previous output and
token, at the next position. A rejected chain is rolled back by position: the next catch-up overwrites it.

Drafts are drawn in the draft vocabulary and mapped onto the target's through d2t (target = draft + d2t[draft]);
the draft distribution the acceptor sees is the head's over the target vocabulary, 0 outside the draft vocabulary
(vLLM's compute_logits does the same with -inf logits, llama_eagle3.py at 00bd1493), so rejection sampling stays
lossless. With the request's per-position noise a token is drawn as the target's draw at that position would be
(Gumbel coupling, position_noise.py): the same noise, gathered at the draft vocabulary's target ids.

All rows of a batch draft in lock-step (`propose_together`): one head call per drafted position scores every row
still drafting, as drafters/model.py does for draft models.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

import torch

from neuron_ssp.backends.base import HiddenStates, ModelBackend
from neuron_ssp.drafters.base import Draft, DraftMask
from neuron_ssp.drafters.eagle_checkpoint import EagleCheckpoint
from neuron_ssp.drafters.eagle_head import EagleHead, HeadCache
from neuron_ssp.errors import Problem, RuntimeProblem, UsageError
from neuron_ssp.speculation.position_noise import PositionNoise, race
from neuron_ssp.speculation.sampling import SamplingParams, first_non_finite_row, logits_to_probs, sample
from neuron_ssp.topology.head_config import default_taps


class EagleModel:
    """What every row's drafter shares: the head, its KV cache of one slot per target slot, and the target's
    vocabulary size. Building it tells the target which layers to tap (once)."""

    def __init__(self, checkpoint: EagleCheckpoint, target: ModelBackend, field: str = "draft.path"):
        """`field`: the config field that named the head (errors)."""
        config = checkpoint.config
        if not isinstance(target, HiddenStates):
            raise UsageError(
                Problem(
                    field,
                    target.name,
                    "an EAGLE-3 head drafts from the target's hidden states, which this backend does not return",
                    "use platform.backend: torch, or drafter: ngram / model",
                )
            )
        embedding = target.token_embedding()
        taps = config.taps or default_taps(target.num_layers)
        problems = []
        if config.vocab_size != target.vocab_size:
            problems.append(
                Problem(
                    field,
                    config.vocab_size,
                    f"the head was trained for a vocabulary of {config.vocab_size} tokens; the target has "
                    f"{target.vocab_size}",
                    "use the head trained for this target",
                )
            )
        own = "embed_tokens.weight" in checkpoint.tensors
        width = embedding.shape[1]
        if (
            config.target_hidden_size != width
            or (not own and config.hidden_size != width)
            or max(taps) >= target.num_layers
        ):
            problems.append(
                Problem(
                    field,
                    f"widths {config.target_hidden_size} / {config.hidden_size}, taps {list(taps)}",
                    f"the head reads taps at layers {list(taps)} of a target {config.target_hidden_size} wide; this "
                    f"target is {width} wide with {target.num_layers} layers",
                    "use the head trained for this target",
                )
            )
        if problems:
            raise UsageError(problems)
        target.set_taps(taps)
        # where the target's embedding lives (the target's device): the taps arrive there
        self.head = EagleHead.from_checkpoint(checkpoint, embedding).eval().requires_grad_(False).to(embedding.device)
        self.cache = HeadCache(config, target.slots, target.n_positions, embedding.device)
        self.taps = tuple(taps)
        self.vocab_size = target.vocab_size
        self.draft_ids = self.head.target_ids  # target id of each draft id

    def to_target(self, draft_logits: torch.Tensor) -> torch.Tensor:
        """(m, draft_vocab) logits -> (m, vocab): the same logits at the target ids, -inf (probability 0) elsewhere."""
        return to_target_logits(draft_logits, self.draft_ids, self.vocab_size)


@torch.inference_mode()
def measure_head_ms(model: EagleModel, repeats: int = 9) -> float:
    """Median milliseconds of one head call of one row (a chain step), on slot 0 (rewritten by its first request)."""
    head = model.head
    hidden = torch.zeros(1, head.config.hidden_size, device=head.embed.device)
    times = []
    for position in range(repeats + 1):
        begin = time.perf_counter()
        head.logits(head.decode(hidden, torch.zeros(1, dtype=torch.long), [(0, position, 1)], model.cache))
        times.append(1000.0 * (time.perf_counter() - begin))
    return statistics.median(times[1:])  # the first call pays one-off costs


def to_target_logits(draft_logits: torch.Tensor, draft_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    logits = draft_logits.new_full((draft_logits.shape[0], vocab_size), float("-inf"))
    logits[:, draft_ids] = draft_logits
    return logits


class EagleDrafter:
    """One row's drafter: its slot of the shared head cache and the target's taps it has not fed the head yet."""

    def __init__(
        self,
        model: EagleModel,
        slot: int,
        sampling: SamplingParams,
        generator: torch.Generator | None = None,
        stop_below: float = 0.0,
    ):
        """`stop_below`: the draft-confidence rule, stop drafting when the draft's top probability (temperature 1)
        falls below it; 0 never stops early."""
        self.model = model
        self.slot = slot
        self.vocab_size = model.vocab_size
        self.taps = model.taps
        self.sampling = sampling
        self.generator = generator
        self.stop_below = stop_below
        self._fed = 0  # head cache positions 0.._fed-1 hold the pairs of committed tokens
        self._pending: list[torch.Tensor] = []  # taps of positions _fed.. not fed yet, in order
        self._noise: PositionNoise | None = None
        self._prompt_len = 0
        self.mask: DraftMask | None = None  # the row's processors, set by the loop before each proposal

    def begin(self, prompt_ids: torch.Tensor, max_new_tokens: int, noise: PositionNoise | None = None) -> None:
        """The prompt's taps come from the target's prefill (`take_hidden`)."""
        self._fed, self._pending = 0, []
        self._noise, self._prompt_len = noise, prompt_ids.shape[0]

    @property
    def fed_positions(self) -> int:
        return self._fed

    def resume_at(self, position: int) -> None:
        self._fed, self._pending = position, []

    def take_hidden(self, start: int, hidden: torch.Tensor) -> None:
        """The target's taps (n, taps x hidden) at positions start..start+n-1, all of committed tokens; what was
        kept from `start` on is stale (a rolled-back position)."""
        held = sum(part.shape[0] for part in self._pending)
        if start > self._fed + held:
            raise RuntimeError(f"EAGLE drafter: taps from position {start}, but none yet for {self._fed + held}")
        if start < self._fed:
            self._fed, self._pending = start, []
        else:
            self._pending = _rows_before(self._pending, start - self._fed)
        self._pending.append(hidden)

    def propose(self, sequence: torch.Tensor, max_tokens: int) -> Draft:
        return propose_together([(self, sequence, max_tokens)])[0]

    def for_row(self, slot: int, sampling: SamplingParams, rng: torch.Generator | None) -> EagleDrafter:
        """The head's cache slot of the row."""
        return EagleDrafter(self.model, slot, sampling, rng, self.stop_below)

    def finish(self, sequence: torch.Tensor) -> None:
        """A head learns nothing across requests."""

    @staticmethod
    def propose_together(requests: Sequence[tuple[EagleDrafter, torch.Tensor, int]]) -> list[Draft]:
        """Several rows' chains in lock-step (module-level `propose_together`): base.LockStep."""
        return propose_together(requests)


def _rows_before(parts: list[torch.Tensor], rows: int) -> list[torch.Tensor]:
    """The first `rows` rows of consecutive parts."""
    kept, left = [], rows
    for part in parts:
        if left <= 0:
            break
        kept.append(part[:left])
        left -= part.shape[0]
    return kept


class _Chain:
    """One row's chain in progress: its next head input (hidden, token, span; `live` False once done) and what it
    drew."""

    def __init__(self, drafter: EagleDrafter, sequence: torch.Tensor, max_tokens: int):
        if not drafter._pending:
            raise RuntimeError("EAGLE drafter: no target hidden states since the last draft (the loop must pass them)")
        taps = torch.cat(drafter._pending)
        start, count = drafter._fed, taps.shape[0]
        if sequence.shape[0] < start + 1 + count:
            raise RuntimeError(
                f"EAGLE drafter: taps up to position {start + count - 1} but only {sequence.shape[0]} tokens"
            )
        self.drafter, self.max_tokens = drafter, max_tokens
        self.output_start = sequence.shape[0] - drafter._prompt_len  # output position of the first draft token
        self.hidden = drafter.model.head.fuse(taps)
        self.tokens_in = sequence[start + 1 : start + 1 + count]  # the token after each tapped position
        self.span = (drafter.slot, start, count)
        drafter._fed, drafter._pending = start + count, []
        self.tokens: list[int] = []
        self.rows: list[torch.Tensor] = []
        self.live = True

    def take(self, out: torch.Tensor) -> None:
        """The head's output at the last position fed: draw the next token, then feed it back (or stop)."""
        drafter = self.drafter
        if len(self.tokens) == self.max_tokens:
            self.live = False
            return
        draft_logits = drafter.model.head.logits(out.view(1, -1))
        position = self.span[1] + self.span[2] - 1
        if first_non_finite_row(draft_logits) is not None:
            raise RuntimeProblem(
                Problem(
                    "draft.path",
                    "EAGLE-3 head",
                    f"the head produced non-finite logits (NaN or inf) at position {position}",
                    "check the head's weights (an fp16 overflow, a broken export)",
                )
            )
        if drafter.stop_below and float(draft_logits.softmax(-1).max()) < drafter.stop_below:
            self.live = False
            return
        if drafter.mask is not None:  # the mask lives in the target's vocabulary: through it and back
            masked = drafter.mask(drafter.model.to_target(draft_logits)[0], self.tokens)
            draft_logits = masked[drafter.model.draft_ids].view(1, -1)
        draft_id = self._draw(draft_logits[0], self.output_start + len(self.tokens))
        token = int(drafter.model.draft_ids[draft_id])
        self.tokens.append(token)
        self.rows.append(draft_logits[0])
        self.live = len(self.tokens) < self.max_tokens
        self.hidden, self.tokens_in = out.view(1, -1), torch.tensor([token])
        self.span = (drafter.slot, position + 1, 1)

    def _draw(self, draft_logits: torch.Tensor, output_position: int) -> int:
        """A draft id: the argmax (greedy), the race with the target's noise at this output position gathered at
        the draft vocabulary's target ids (coupled), or a sample from the generator."""
        drafter = self.drafter
        params = drafter.sampling
        if params.greedy:
            return int(draft_logits.argmax())
        probs = logits_to_probs(draft_logits, params)
        if drafter._noise is None:
            return int(sample(probs, drafter.generator))
        noise = drafter._noise.shifted(output_position).at(0, drafter.vocab_size, probs.device)
        return race(probs, noise[drafter.model.draft_ids])

    def draft(self) -> Draft:
        if not self.tokens:
            return Draft.empty(self.drafter.vocab_size)
        return Draft(torch.tensor(self.tokens), self.drafter.model.to_target(torch.stack(self.rows)))


@torch.inference_mode()
def propose_together(requests: Sequence[tuple[EagleDrafter, torch.Tensor, int]]) -> list[Draft]:
    """Each row's chain, all rows of one head in lock-step: the catch-up call over every row's new positions
    gives each first token, then one head call per further position for the rows still drafting. A row's
    numbers do not depend on the rows beside it (its own cache slot), short of matmul rounding."""
    chains = [_Chain(drafter, sequence, max_tokens) for drafter, sequence, max_tokens in requests]
    groups: dict[int, list[_Chain]] = {}
    for chain in chains:
        groups.setdefault(id(chain.drafter.model), []).append(chain)
    for group in groups.values():
        model = group[0].drafter.model
        live = group
        while live:
            out = model.head.decode(
                torch.cat([chain.hidden for chain in live]),
                torch.cat([chain.tokens_in for chain in live]),
                [chain.span for chain in live],
                model.cache,
            )
            ends = torch.tensor([chain.span[2] for chain in live]).cumsum(0) - 1
            for chain, end in zip(live, ends.tolist(), strict=True):
                chain.take(out[end])
            live = [chain for chain in live if chain.live]
    return [chain.draft() for chain in chains]
