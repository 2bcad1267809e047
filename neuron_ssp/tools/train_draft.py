"""Train an EAGLE-3 head for a target on the target's own conversations (tools/draft_data.py).

The recipe follows SafeAILab/EAGLE cb7e0841 `eagle/traineagle3/` (cited file:line) where a CPU allows it:
- features: the target's three taps and its logits at every position, recomputed by a prefill through the
  backend's hidden-state API (backends.base.HiddenStates) rather than stored, so training and drafting read
  the same numbers (`cnets.py:713-731` runs the target in the training step the same way);
- training-time test: `ttt_steps` steps (7 there, `cnets.py:498`), step i feeding the head's own output of step
  i-1 as its hidden state with the data's tokens shifted by i (`cnets.py:847, 862-864`);
- soft targets: the target's distribution over the draft vocabulary (softmax of its logits restricted to t2d,
  `cnets.py:833-842`), cross-entropy counted where the target's argmax is in the draft vocabulary
  (`cnets.py:837-839`); step i weighted 0.8^i (`main.py:284-285`); AdamW betas (0.9, 0.95), gradient clipping
  0.5 (`ds_config.json`);
- the loss counts the assistant's answers only: the predicted token lies in the answer (SafeAILab's loss_mask).
Differences, said here so nobody guesses: the loss is a mean over counted positions (SafeAILab: over all
positions of the batch, `cnets.py:855`), the learning rate is larger and constant after a short warm-up (its
5e-5 with 12000 warm-up steps is for millions of GPU tokens), and the head may start from one of the target's
layers (`init_layer`) and its lm_head from the target's output rows (`init_lm_head`).

Resumable: the state (head, optimizer, step, data order, history) is written every `checkpoint_minutes` and at
the end; a second run continues it. The head is written in the standard EAGLE-3 layout (eagle_checkpoint).
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from neuron_ssp.backends.base import Segment
from neuron_ssp.drafters.eagle_checkpoint import EagleConfig, vocab_maps, write_checkpoint
from neuron_ssp.drafters.eagle_head import EagleHead
from neuron_ssp.errors import Problem, UsageError
from neuron_ssp.tools.draft_data import Conversations

STATE_FILE = "train_state.pt"
HEAD_DIR = "head"
RECIPE_FILE = "recipe.json"
HISTORY_FILE = "history.json"


@dataclass(frozen=True)
class TrainSettings:
    ttt_steps: int = 7  # SafeAILab cnets.py:498
    loss_decay: float = 0.8  # main.py:284
    lr: float = 1e-3
    warmup_steps: int = 20
    weight_decay: float = 0.0  # ds_config.json
    grad_clip: float = 0.5  # ds_config.json
    batch_tokens: int = 512  # conversations per optimizer step: as many as fit in this many tokens
    seed: int = 0
    held_out: float = 0.05  # share of conversations (by a hash of their index) never trained on
    draft_vocab_size: int = 8192
    init_layer: int | None = None  # start the head's layer (and lm_head) from the target's
    init_lm_head: bool = False  # start lm_head and norm from the target's
    max_train_tokens: int | None = None  # the first N tokens of the training split (the learning curve)


def held_out_index(index: int, share: float) -> bool:
    """A fixed pseudo-random share of conversations, independent of how they were sampled (index % 4: greedy)."""
    return (index * 2654435761) % 2**32 < share * 2**32


def split(conversations: Conversations, share: float, max_train_tokens: int | None) -> tuple[list[int], list[int]]:
    """(training, held-out) positions in `conversations`; training cut to its first `max_train_tokens`."""
    train, held = [], []
    tokens = 0
    for position, index in enumerate(conversations.index):
        if held_out_index(index, share):
            held.append(position)
        elif max_train_tokens is None or tokens < max_train_tokens:
            train.append(position)
            tokens += len(conversations.ids[position])
    return train, held


def new_head(
    target_model: Any, config: EagleConfig, draft_ids: torch.Tensor, init_layer: int | None, init_lm_head: bool
) -> EagleHead:
    """A fresh head on the target's embedding. `init_lm_head`: its norm and lm_head start as the target's final norm
    and (tied) output rows of the draft vocabulary, so the head only has to produce a state the target's own head
    reads. `init_layer` (implies init_lm_head): its decoder layer starts as the target's layer (q/k/v read the hidden
    half of [embedding; hidden]) and fc picks the last tap: the head starts as an early exit of the target."""
    embedding = target_model.get_input_embeddings().weight.detach()
    head = EagleHead(config, embedding)
    head.target_ids.copy_(draft_ids)
    with torch.no_grad():
        if init_lm_head or init_layer is not None:
            head.norm.copy_(target_model.model.norm.weight)
            head.lm_head.copy_(target_model.get_output_embeddings().weight[draft_ids])
        if init_layer is not None:
            copy_layer(head, target_model.model.layers[init_layer])
    return head


def copy_layer(head: EagleHead, layer: Any) -> None:
    h = head.config.hidden_size
    head.fc.zero_()
    head.fc[:, 2 * h : 3 * h] = torch.eye(h)
    for name, source in (("q", layer.self_attn.q_proj), ("k", layer.self_attn.k_proj), ("v", layer.self_attn.v_proj)):
        weight = getattr(head, name)
        weight.zero_()
        weight[:, h:] = source.weight
    head.o.copy_(layer.self_attn.o_proj.weight)
    head.gate.copy_(layer.mlp.gate_proj.weight)
    head.up.copy_(layer.mlp.up_proj.weight)
    head.down.copy_(layer.mlp.down_proj.weight)
    head.hidden_norm.copy_(layer.input_layernorm.weight)
    head.post_norm.copy_(layer.post_attention_layernorm.weight)


TOP_K = 64  # the target's distribution over the draft vocabulary is kept as its K most likely draft ids


@dataclass
class Features:
    """One conversation's target features, compact (fp16 taps, the top-K soft targets): what an epoch after the
    first reuses instead of a new prefill (measured: the prefill is ~60% of a training step's CPU time)."""

    taps: torch.Tensor  # (L, 3 x target hidden) fp16
    top_ids: torch.Tensor  # (L, K) int16 draft ids, most likely first
    top_p: torch.Tensor  # (L, K) fp16: the target's probabilities of those ids, renormalised over the K
    argmax: torch.Tensor  # (L,) int32: the target's argmax over its whole vocabulary (a target id)

    @property
    def bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.taps, self.top_ids, self.top_p, self.argmax))


@dataclass
class Batch:
    """Conversations padded to one length T, with the target's features at every position."""

    ids: torch.Tensor  # (B, T) token ids (0 past a conversation's end)
    lengths: torch.Tensor  # (B,)
    answer_start: torch.Tensor  # (B,)
    taps: torch.Tensor  # (B, T, 3 x target hidden)
    top_ids: torch.Tensor  # (B, T, K) draft ids: the target's K most likely, restricted to the draft vocabulary
    top_p: torch.Tensor  # (B, T, K) their probabilities (the soft target)
    target_argmax: torch.Tensor  # (B, T) target ids
    greedy: torch.Tensor  # (B,) bool: the data's tokens are the target's argmax (greedy answers)

    @property
    def tokens(self) -> int:
        return int(self.lengths.sum())


def target_features(backend: Any, ids: list[np.ndarray], draft_ids: torch.Tensor) -> list[Features]:
    """The target over the conversations (slot i each, from position 0, as many per call as it has slots): taps and
    logits of every row, kept compact. The soft target is SafeAILab's softmax of the logits restricted to the draft
    vocabulary (cnets.py:840-842), cut to its TOP_K most likely ids and renormalised."""
    out = []
    for first in range(0, len(ids), backend.slots):
        chunk = ids[first : first + backend.slots]
        segments = [
            Segment(slot, 0, torch.from_numpy(tokens), hidden_rows=len(tokens)) for slot, tokens in enumerate(chunk)
        ]
        logits, taps = backend.score_batch_hidden(segments)
        begin = 0
        for tokens in chunk:
            end = begin + len(tokens)
            rows = logits[begin:end]
            top_logits, top_ids = rows[:, draft_ids].topk(min(TOP_K, draft_ids.shape[0]), -1)
            out.append(
                Features(
                    taps[begin:end].half(),
                    top_ids.short(),
                    top_logits.softmax(-1).half(),
                    rows.argmax(-1).int(),
                )
            )
            begin = end
    return out


def collate(features: list[Features], ids: list[np.ndarray], answer_start: list[int], greedy: list[bool]) -> Batch:
    """Conversations and their features padded to the longest (ids 0, probabilities 0 past each end)."""
    lengths = [len(tokens) for tokens in ids]
    longest, batch = max(lengths), len(ids)
    k = features[0].top_ids.shape[1]
    padded_ids = torch.zeros(batch, longest, dtype=torch.long)
    taps = torch.zeros(batch, longest, features[0].taps.shape[1])
    top_ids = torch.zeros(batch, longest, k, dtype=torch.long)
    top_p = torch.zeros(batch, longest, k)
    argmax = torch.zeros(batch, longest, dtype=torch.long)
    for row, (item, tokens, length) in enumerate(zip(features, ids, lengths, strict=True)):
        padded_ids[row, :length] = torch.from_numpy(tokens)
        taps[row, :length] = item.taps.float()
        top_ids[row, :length] = item.top_ids.long()
        top_p[row, :length] = item.top_p.float()
        argmax[row, :length] = item.argmax.long()
    return Batch(
        padded_ids,
        torch.tensor(lengths),
        torch.tensor(answer_start),
        taps,
        top_ids,
        top_p,
        argmax,
        torch.tensor(greedy),
    )


class FeatureCache:
    """Features of conversations already prefilled in this run, up to `limit_bytes` (then the rest is recomputed)."""

    def __init__(self, limit_bytes: int):
        self.limit = limit_bytes
        self.items: dict[int, Features] = {}
        self.bytes = 0

    def batch(self, backend: Any, conversations: Conversations, positions: list[int], draft_ids: torch.Tensor) -> Batch:
        """The batch of these conversations: cached features, the others prefilled now (and kept while room)."""
        missing = [p for p in positions if p not in self.items]
        computed = target_features(backend, [conversations.ids[p] for p in missing], draft_ids)
        fresh = dict(zip(missing, computed, strict=True))
        for position, item in fresh.items():
            if self.bytes + item.bytes <= self.limit:
                self.items[position] = item
                self.bytes += item.bytes
        return collate(
            [fresh[p] if p in fresh else self.items[p] for p in positions],
            [conversations.ids[p] for p in positions],
            [conversations.answer_start[p] for p in positions],
            [conversations.temperature[p] == 0.0 for p in positions],
        )


@dataclass
class StepResult:
    """Per training-time-test step: loss (a tensor, for backward), correct top-1 drafts, counted positions."""

    losses: list[torch.Tensor]
    correct: list[int]
    counted: list[int]
    chain_ok: torch.Tensor  # (steps, B, T) bool: step i's draft at p equals the target's argmax


def training_time_test(head: EagleHead, batch: Batch, steps: int, in_draft: torch.Tensor) -> StepResult:
    """SafeAILab's training-time test over a batch (cnets.py:790-866): step i's output at p predicts the token at
    p + 2 + i from the target's distribution at q = p + 1 + i, counted where that token is in an answer.
    `in_draft`: (V,) bool, the draft vocabulary as a mask over target ids (t2d)."""
    b, t = batch.ids.shape
    positions = torch.arange(t)
    hidden = head.fuse(batch.taps)
    cache = None
    losses, correct, counted, chain = [], [], [], []
    for step in range(steps):
        shift = 1 + step
        tokens = torch.zeros_like(batch.ids)
        tokens[:, : t - shift] = batch.ids[:, shift:]
        hidden, cache = head(hidden, tokens, cache)
        logp = torch.log_softmax(head.logits(hidden), -1)
        q = positions + shift  # where the target's distribution for this prediction sits
        valid = (q.unsqueeze(0) <= batch.lengths.unsqueeze(1) - 2) & (
            q.unsqueeze(0) >= batch.answer_start.unsqueeze(1) - 1
        )
        q = q.clamp(max=t - 1)
        target_arg = batch.target_argmax[:, q]
        counted_mask = valid & in_draft[target_arg]
        per_position = -(batch.top_p[:, q] * logp.gather(-1, batch.top_ids[:, q])).sum(-1)
        n = int(counted_mask.sum())
        losses.append((per_position * counted_mask).sum() / max(n, 1))
        drafted = head.target_ids[logp.argmax(-1)]
        ok = (drafted == target_arg) & valid
        chain.append(ok)
        correct.append(int(ok.sum()))
        counted.append(int(valid.sum()))
    return StepResult(losses, correct, counted, torch.stack(chain))


def weighted_loss(losses: list[torch.Tensor], decay: float) -> torch.Tensor:
    return sum(decay**i * loss for i, loss in enumerate(losses))  # type: ignore[return-value]


def batches(order: list[int], lengths: list[int], budget: int) -> list[list[int]]:
    """Consecutive conversations of `order` grouped so each group holds at most `budget` tokens (at least one)."""
    groups: list[list[int]] = []
    current: list[int] = []
    tokens = 0
    for position in order:
        if current and tokens + lengths[position] > budget:
            groups.append(current)
            current, tokens = [], 0
        current.append(position)
        tokens += lengths[position]
    if current:
        groups.append(current)
    return groups


@dataclass
class History:
    """What the run measured: training loss and accuracy per step, and held-out evaluations."""

    steps: list[int] = field(default_factory=list)
    tokens_seen: list[int] = field(default_factory=list)
    loss: list[list[float]] = field(default_factory=list)
    accuracy: list[list[float]] = field(default_factory=list)
    evaluations: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class TrainState:
    step: int = 0
    epoch: int = 0
    cursor: int = 0  # next batch of this epoch's order
    tokens_seen: int = 0
    seconds: float = 0.0
    history: History = field(default_factory=History)


def lr_at(step: int, settings: TrainSettings) -> float:
    return settings.lr * min(1.0, (step + 1) / settings.warmup_steps)


def epoch_order(train: list[int], lengths: list[int], seed: int, epoch: int, window: int = 32) -> list[int]:
    """The epoch's shuffled order, sorted by length within windows of `window` conversations, so a batch pads
    its conversations to similar lengths (less padding, the same data)."""
    order = list(train)
    random.Random(seed * 7919 + epoch).shuffle(order)
    return [p for i in range(0, len(order), window) for p in sorted(order[i : i + window], key=lambda p: lengths[p])]


def save_state(
    directory: Path, head: EagleHead, optimizer: torch.optim.Optimizer, state: TrainState, meta: dict[str, Any]
) -> None:
    """Atomically, so a run killed while writing keeps the previous state."""
    tmp = directory / f".{STATE_FILE}.tmp"
    torch.save(
        {
            "head": head.state_dict(),
            "target_ids": head.target_ids,
            "optimizer": optimizer.state_dict(),
            "state": asdict(state),
            "meta": meta,
        },
        tmp,
    )
    tmp.replace(directory / STATE_FILE)


def load_state(directory: Path) -> dict[str, Any] | None:
    path = directory / STATE_FILE
    return torch.load(path, weights_only=False) if path.exists() else None


def restore(saved: dict[str, Any]) -> TrainState:
    data = dict(saved["state"])
    data["history"] = History(**data["history"])
    return TrainState(**data)


def check_resumable(saved_meta: dict[str, Any], meta: dict[str, Any], directory: Path) -> None:
    """A resumed run must train the same head on the same split: every setting that differs is refused."""
    saved = dict(asdict(TrainSettings(**saved_meta["settings"])), taps=saved_meta["taps"])  # newer keys: defaults
    wanted = dict(meta["settings"], taps=meta["taps"])
    changed = [key for key in wanted if saved.get(key) != wanted[key]]
    if changed:
        raise UsageError(
            [
                Problem(
                    key,
                    wanted[key],
                    f"the run saved in {directory / STATE_FILE} has {key} = {saved.get(key)}",
                    f"rerun with {key} = {saved.get(key)}, or train into another --work directory",
                )
                for key in changed
            ]
        )


def write_head(head: EagleHead, directory: Path, recipe: dict[str, Any], dtype: torch.dtype = torch.float16) -> Path:
    """The head in the standard EAGLE-3 layout (fp16 by default) with its recipe beside it."""
    d2t, t2d = vocab_maps(head.target_ids, head.config.vocab_size)
    write_checkpoint(head.to_checkpoint(d2t, t2d), directory, dtype)
    (directory / RECIPE_FILE).write_text(json.dumps(recipe, indent=2) + "\n")
    return directory


Progress = Callable[[TrainState, StepResult | None], None]


def train(
    backend: Any,
    head: EagleHead,
    conversations: Conversations,
    train_positions: list[int],
    settings: TrainSettings,
    work: Path,
    seconds: float,
    meta: dict[str, Any],
    checkpoint_seconds: float = 300.0,
    cache: FeatureCache | None = None,
    evaluate: Callable[[EagleHead], dict[str, Any]] | None = None,
    evaluate_every: int = 0,
    on_step: Progress | None = None,
) -> TrainState:
    """Train `head` for `seconds` (resuming the state in `work` if there is one); returns the state at the end."""
    work.mkdir(parents=True, exist_ok=True)
    optimizer = torch.optim.AdamW(
        [p for p in head.parameters() if p.requires_grad],
        lr=settings.lr,
        betas=(0.9, 0.95),
        weight_decay=settings.weight_decay,
    )
    saved = load_state(work)
    state = TrainState()
    if saved is not None:
        head.load_state_dict(saved["head"])
        head.target_ids.copy_(saved["target_ids"])
        optimizer.load_state_dict(saved["optimizer"])
        state = restore(saved)
    in_draft = torch.zeros(head.config.vocab_size, dtype=torch.bool)
    in_draft[head.target_ids] = True
    lengths = [len(tokens) for tokens in conversations.ids]
    torch.manual_seed(settings.seed + state.step)
    cache = cache or FeatureCache(0)
    begin = time.perf_counter()
    last_save = begin
    spent_before = state.seconds
    while time.perf_counter() - begin < seconds:
        groups = batches(
            epoch_order(train_positions, lengths, settings.seed, state.epoch), lengths, settings.batch_tokens
        )
        if state.cursor >= len(groups):
            state.epoch, state.cursor = state.epoch + 1, 0
            continue
        group = groups[state.cursor]
        batch = cache.batch(backend, conversations, group, head.target_ids)
        for group_ in optimizer.param_groups:
            group_["lr"] = lr_at(state.step, settings)
        result = training_time_test(head, batch, settings.ttt_steps, in_draft)
        loss = weighted_loss(result.losses, settings.loss_decay)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), settings.grad_clip)
        optimizer.step()
        state.step += 1
        state.cursor += 1
        state.tokens_seen += batch.tokens
        state.seconds = spent_before + time.perf_counter() - begin
        history = state.history
        history.steps.append(state.step)
        history.tokens_seen.append(state.tokens_seen)
        history.loss.append([round(float(x.detach()), 4) for x in result.losses])
        history.accuracy.append([round(c / max(n, 1), 4) for c, n in zip(result.correct, result.counted, strict=True)])
        if evaluate is not None and evaluate_every and state.step % evaluate_every == 0:
            history.evaluations.append({"step": state.step, "tokens_seen": state.tokens_seen, **evaluate(head)})
        if on_step is not None:
            on_step(state, result)
        if time.perf_counter() - last_save >= checkpoint_seconds:
            save_state(work, head, optimizer, state, meta)
            last_save = time.perf_counter()
    state.seconds = spent_before + time.perf_counter() - begin
    save_state(work, head, optimizer, state, meta)
    return state
