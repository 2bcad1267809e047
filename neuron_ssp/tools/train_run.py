"""`neuron-ssp train-draft` end to end: data, target, draft vocabulary, head, training, evaluation, head on disk.

A run resumes the state in its work directory (the same split, vocabulary and settings), trains for its minutes,
evaluates on held-out conversations, and writes the head (standard EAGLE-3 layout, fp16) with its recipe, the
history (history.json) and, if asked, a plot of loss and per-step accuracy.
"""

from __future__ import annotations

import json
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from neuron_ssp.backends.base import Segment
from neuron_ssp.backends.torch.scoring import TorchBackend
from neuron_ssp.config import EMBEDDED_PREFIX, Config, load_config
from neuron_ssp.drafters.eagle_checkpoint import default_taps, head_config_for
from neuron_ssp.drafters.eagle_head import EagleHead, HeadCache
from neuron_ssp.embedded.models import check_embedded_answer, resolve_model_path
from neuron_ssp.tools.budget_bar import budget_bar
from neuron_ssp.tools.draft_data import Conversations, load_conversations
from neuron_ssp.tools.draft_eval import Evaluation, evaluate
from neuron_ssp.tools.draft_vocab import SIZES, VocabChoice, answer_token_counts, choose_size, time_call, top_ids
from neuron_ssp.tools.train_draft import (
    HISTORY_FILE,
    Batch,
    FeatureCache,
    StepResult,
    TrainSettings,
    TrainState,
    batches,
    check_resumable,
    load_state,
    new_head,
    split,
    train,
    write_head,
)

WINDOWS = (2, 3, 4, 5, 6, 8)
ALPHA_FOR_VOCAB = 0.6  # per-step acceptance assumed when sizing the vocabulary (the probe's step 1 was 0.33-0.6)
WINDOW_FOR_VOCAB = 5


@dataclass(frozen=True)
class TrainRequest:
    config_path: Path | None
    data: Path
    work: Path
    out: Path
    minutes: float
    draft_vocab: int | None  # None: chosen by coverage against measured cost
    ttt_steps: int
    lr: float
    batch_tokens: int
    seed: int
    held_out: float
    init_layer: int | None
    init_lm_head: bool
    max_train_tokens: int | None
    eval_every: int
    eval_tokens: int
    checkpoint_minutes: float
    plot: Path | None
    feature_cache_mb: int = 3000


def run_training(request: TrainRequest, console: Console, status: Console) -> None:
    conversations = load_conversations(request.data)
    longest = max(len(ids) for ids in conversations.ids)
    slots = 8  # conversations per target call (train_draft.target_features)
    config = load_config(request.config_path, {"target.n_positions": longest + 8})
    with status.status(f"loading {config.target.path}"):
        backend = target_backend(config, slots)
    target_model = backend.model
    layers = int(target_model.config.num_hidden_layers)
    taps = default_taps(layers)
    backend.set_taps(list(taps))
    saved = load_state(request.work)
    if saved is not None:
        meta = saved["meta"]
        settings = TrainSettings(**meta["settings"])
        vocab = request.draft_vocab or settings.draft_vocab_size
        check_resumable(meta, {"settings": asdict(requested(request, vocab)), "taps": list(taps)}, request.work)
        position_of = {index: position for position, index in enumerate(conversations.index)}
        train_positions = [position_of[i] for i in meta["train_index"]]
        held_positions = [position_of[i] for i in meta["held_index"] if i in position_of]
        draft_ids = saved["target_ids"]
        console.print(f"resuming {request.work}: step {saved['state']['step']}, {len(train_positions)} conversations")
    else:
        train_positions, held_positions = split(conversations, request.held_out, request.max_train_tokens)
        counts = answer_token_counts(
            [conversations.ids[p] for p in train_positions],
            [conversations.answer_start[p] for p in train_positions],
            int(target_model.config.vocab_size),
        )
        held_counts = answer_token_counts(
            [conversations.ids[p] for p in held_positions],
            [conversations.answer_start[p] for p in held_positions],
            int(target_model.config.vocab_size),
        )
        choice, table = size_vocabulary(backend, target_model, taps, counts, held_counts, request.draft_vocab)
        console.print(vocab_table(table, choice))
        settings = requested(request, choice.size)
        draft_ids = top_ids(counts, choice.size)
        meta = {
            "settings": asdict(settings),
            "taps": list(taps),
            "train_index": [conversations.index[p] for p in train_positions],
            "held_index": [conversations.index[p] for p in held_positions],
            "vocab_table": [asdict(row) for row in table],
        }
    head_cfg = head_config_for(target_model.config.to_dict(), int(draft_ids.shape[0]), taps)
    head = new_head(target_model, head_cfg, draft_ids, settings.init_layer, settings.init_lm_head)
    train_tokens = sum(len(conversations.ids[p]) for p in train_positions)
    console.print(
        f"training split: {len(train_positions)} conversations, {train_tokens:,} tokens; "
        f"held out: {len(held_positions)} conversations"
    )
    with status.status("target features of the held-out conversations"):
        held_batches = held_out_batches(
            backend, conversations, held_positions, draft_ids, request.eval_tokens, request.batch_tokens
        )

    def run_eval(current: EagleHead) -> dict[str, Any]:
        return evaluate(current, held_batches, settings.ttt_steps, WINDOWS).to_dict()

    begin_cpu = time.process_time()
    state = train_with_progress(
        backend, head, conversations, train_positions, settings, request, meta, run_eval, status, train_tokens
    )
    final = evaluate(head, held_batches, settings.ttt_steps, WINDOWS)
    state.history.evaluations.append({"step": state.step, "tokens_seen": state.tokens_seen, **final.to_dict()})
    recipe = make_recipe(
        request, settings, meta, state, final, train_tokens, len(train_positions), time.process_time() - begin_cpu
    )
    write_head(head, request.out, recipe)
    (request.work / HISTORY_FILE).write_text(json.dumps(asdict(state.history)) + "\n")
    console.print(evaluation_table(final))
    console.print(f"head written to {request.out} (recipe.json beside it); history in {request.work / HISTORY_FILE}")
    if request.plot is not None:
        from neuron_ssp.tools.draft_plots import plot_training

        plot_training(state.history, request.plot, f"EAGLE-3 head, {train_tokens:,} training tokens")
        console.print(f"plot: {request.plot}")


def requested(request: TrainRequest, draft_vocab_size: int) -> TrainSettings:
    return TrainSettings(
        ttt_steps=request.ttt_steps,
        lr=request.lr,
        batch_tokens=request.batch_tokens,
        seed=request.seed,
        held_out=request.held_out,
        draft_vocab_size=draft_vocab_size,
        init_layer=request.init_layer,
        init_lm_head=request.init_lm_head,
        max_train_tokens=request.max_train_tokens,
    )


def target_backend(config: Config, slots: int) -> TorchBackend:
    """The target alone (no tokenizer needed: the data is token ids), checked like every load of the embedded model."""
    from transformers import AutoTokenizer

    from neuron_ssp.backends.torch.load import load_hf_model, resolve_device

    path = resolve_model_path(config.target.path, "target.path")
    model = load_hf_model(path, config.target.dtype, resolve_device(config.platform.device))
    if config.target.path.startswith(EMBEDDED_PREFIX):
        check_embedded_answer(model, AutoTokenizer.from_pretrained(str(path)), config.target.path, "target.path")
    return TorchBackend(model, config.target.n_positions, "target", config.platform.forward, slots=slots)


def size_vocabulary(
    backend: Any,
    target_model: Any,
    taps: tuple[int, ...],
    counts: np.ndarray,
    held_counts: np.ndarray,
    fixed: int | None,
) -> tuple[VocabChoice, list[VocabChoice]]:
    """Coverage of every size on held-out answers and (measured) cost of a head step of that size per target call."""
    vocab = int(target_model.config.vocab_size)
    sizes = [size for size in SIZES if size < vocab] + [vocab]
    if fixed is not None and fixed not in sizes:
        sizes.append(min(fixed, vocab))
    position = min(300, backend.n_positions - 2)
    target_s = time_call(lambda: backend.score_batch([Segment(0, position, torch.tensor([1]))]))
    costs = {
        size: head_step_seconds(head_config_for(target_model.config.to_dict(), size, taps), target_model, position)
        / target_s
        for size in sizes
    }
    best, table = choose_size(counts, held_counts, costs, ALPHA_FOR_VOCAB, WINDOW_FOR_VOCAB)
    if fixed is not None:
        best = next(row for row in table if row.size == min(fixed, vocab))
    return best, table


def head_step_seconds(config: Any, target_model: Any, position: int) -> float:
    """CPU seconds of one drafted token for one row at `position`: the head's layer and its lm_head."""
    head = EagleHead(config, target_model.get_input_embeddings().weight.detach())
    cache = HeadCache(config, 1, position + 1)
    hidden, token = torch.randn(1, config.hidden_size), torch.tensor([1])

    def step() -> None:
        with torch.no_grad():
            head.logits(head.decode(hidden, token, [(0, position, 1)], cache)).argmax(-1)

    return time_call(step)


def held_out_batches(
    backend: Any,
    conversations: Conversations,
    positions: list[int],
    draft_ids: torch.Tensor,
    eval_tokens: int,
    batch_tokens: int,
) -> list[Batch]:
    """The held-out conversations' features, computed once (up to `eval_tokens` tokens, greedy answers first so tau
    has material)."""
    ordered = sorted(positions, key=lambda p: (conversations.temperature[p] != 0.0, conversations.index[p]))
    kept, tokens = [], 0
    for position in ordered:
        if tokens >= eval_tokens:
            break
        kept.append(position)
        tokens += len(conversations.ids[position])
    lengths = [len(ids) for ids in conversations.ids]
    return [
        FeatureCache(0).batch(backend, conversations, group, draft_ids)
        for group in batches(kept, lengths, batch_tokens)
    ]


def train_with_progress(
    backend: Any,
    head: EagleHead,
    conversations: Conversations,
    train_positions: list[int],
    settings: TrainSettings,
    request: TrainRequest,
    meta: dict[str, Any],
    run_eval: Any,
    status: Console,
    train_tokens: int,
) -> TrainState:
    with budget_bar(status, "train-draft", request.minutes * 60) as update:
        begin = time.perf_counter()

        def show(state: TrainState, result: StepResult | None) -> None:
            accuracy = state.history.accuracy[-1]
            update(
                time.perf_counter() - begin,
                f"step {state.step} epoch {state.tokens_seen / max(train_tokens, 1):.2f} "
                f"loss {state.history.loss[-1][0]:.3f} acc {' '.join(f'{a:.2f}' for a in accuracy[:4])}",
            )

        return train(
            backend,
            head,
            conversations,
            train_positions,
            settings,
            request.work,
            request.minutes * 60,
            meta,
            request.checkpoint_minutes * 60,
            FeatureCache(request.feature_cache_mb * 2**20),
            run_eval,
            request.eval_every,
            show,
        )


def make_recipe(
    request: TrainRequest,
    settings: TrainSettings,
    meta: dict[str, Any],
    state: TrainState,
    final: Evaluation,
    train_tokens: int,
    train_conversations: int,
    cpu_seconds: float,
) -> dict[str, Any]:
    """What a reader needs to retrain this head and to trust its figures."""
    return {
        "command": "neuron-ssp train-draft",
        "data": str(request.data),
        "train_conversations": train_conversations,
        "train_tokens": train_tokens,
        "held_out_conversations": len(meta["held_index"]),
        "settings": asdict(settings),
        "taps": meta["taps"],
        "vocab_table": meta.get("vocab_table"),
        "steps": state.step,
        "epochs": round(state.tokens_seen / max(train_tokens, 1), 3),
        "tokens_seen": state.tokens_seen,
        "wall_seconds": round(state.seconds, 1),
        "cpu_seconds_last_run": round(cpu_seconds, 1),
        "held_out": final.to_dict(),
        "machine": f"{platform.machine()} {platform.processor() or ''}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads",
    }


def vocab_table(table: list[VocabChoice], choice: VocabChoice) -> Table:
    out = Table(title="draft vocabulary: held-out coverage against cost")
    for column in ("size", "coverage", "head step / target call", "speed estimate", ""):
        out.add_column(column, justify="right")
    for row in table:
        mark = "chosen" if row.size == choice.size else ""
        out.add_row(str(row.size), f"{row.coverage:.4f}", f"{row.step_cost:.3f}", f"{row.estimate:.3f}", mark)
    return out


def evaluation_table(result: Evaluation) -> Table:
    out = Table(title=f"held out: {result.tokens:,} tokens, {result.greedy_answers} greedy answers")
    out.add_column("step / k", justify="right")
    out.add_column("top-1 accuracy", justify="right")
    out.add_column("conditional", justify="right")
    out.add_column("tau head (k)", justify="right")
    out.add_column("tau ngram (k)", justify="right")
    ks = sorted(result.tau)
    for i in range(max(len(result.accuracy), len(ks))):
        k = ks[i] if i < len(ks) else None
        out.add_row(
            f"{i + 1} / {k if k is not None else ''}",
            f"{result.accuracy[i]:.3f}" if i < len(result.accuracy) else "",
            f"{result.conditional[i]:.3f}" if i < len(result.conditional) else "",
            f"{result.tau[k]:.3f}" if k is not None else "",
            f"{result.ngram_tau[k]:.3f}" if k is not None else "",
        )
    return out
