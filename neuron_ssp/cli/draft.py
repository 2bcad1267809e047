"""draft-data and train-draft: the target writes its own training data; an EAGLE-3 head learns from it."""

from __future__ import annotations

from pathlib import Path

import click

from neuron_ssp.cli.options import set_threads, threads_option
from neuron_ssp.cli.report import console, status_console
from neuron_ssp.config import load_config
from neuron_ssp.embedded.cache import cache_root
from neuron_ssp.errors import Problem, UsageError
from neuron_ssp.tools.budget_bar import budget_bar

DEFAULT_DATA_DIR = cache_root() / "draft-data" / "smollm2-135m-instruct"
DEFAULT_WORK_DIR = cache_root() / "train-draft" / "smollm2-135m-instruct"


@click.command("draft-data")
@click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path), help="Config YAML (target).")
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_DATA_DIR,
    show_default=True,
    help="Shard directory; a second run continues where the first stopped.",
)
@click.option("--minutes", type=click.FloatRange(min=0, min_open=True), default=60.0, show_default=True)
@click.option("--tokens", type=click.IntRange(min=1), help="Stop once this many tokens are stored (all runs).")
@click.option("--slots", type=click.IntRange(min=1), default=64, show_default=True, help="Rows per target call.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--temperature", type=click.FloatRange(min=0), default=0.7, show_default=True)
@click.option("--greedy-every", type=click.IntRange(min=0), default=4, show_default=True)
@click.option("--max-answer-tokens", type=click.IntRange(min=1), default=384, show_default=True)
@threads_option
def draft_data(
    config_path: Path | None,
    out: Path,
    minutes: float,
    tokens: int | None,
    slots: int,
    seed: int,
    temperature: float,
    greedy_every: int,
    max_answer_tokens: int,
    threads: int | None,
) -> None:
    """The target writes conversations (seed topics, Magpie user turns, passages) for train-draft."""
    from neuron_ssp.backends.torch.load import load_torch_backends
    from neuron_ssp.engines.continuous_batch import ContinuousBatchLoop
    from neuron_ssp.tools.draft_data import DataProgress, DataSettings, generate_data

    set_threads(threads)
    settings = DataSettings(seed, temperature, greedy_every, max_answer_tokens)
    n_positions = 3 * settings.max_user_tokens + max_answer_tokens + 128  # system + task + passage + answer
    config = load_config(config_path, {"target.n_positions": n_positions})
    with status_console.status(f"loading {config.target.path}"):
        target, _, tokenizer = load_torch_backends(config, slots)
    loop = ContinuousBatchLoop(target, 1)
    with budget_bar(status_console, "draft-data", minutes * 60) as update:

        def show(progress: DataProgress) -> None:
            rate = progress.answer_tokens / max(progress.seconds, 1e-9)
            update(
                progress.seconds,
                f"{progress.tokens:,} tokens stored, {progress.conversations} new conversations "
                f"({progress.skipped} skipped), {rate:.0f} answer tok/s",
            )

        result = generate_data(loop, tokenizer, out, settings, minutes * 60, tokens, on_progress=show)
    console.print(
        f"{result.conversations} conversations ({result.answer_tokens:,} answer tokens) in {result.seconds:.0f} s; "
        f"{result.tokens:,} tokens stored in {out}"
    )


@click.command("train-draft")
@click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path), help="Config YAML (target).")
@click.option(
    "--data",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_DATA_DIR,
    show_default=True,
    help="Shards written by draft-data.",
)
@click.option(
    "--work",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_WORK_DIR,
    show_default=True,
    help="Training state (resumed when present), history and plot; the head goes to WORK/head unless --out.",
)
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), help="Directory of the trained head.")
@click.option("--minutes", type=click.FloatRange(min=0, min_open=True), default=30.0, show_default=True)
@click.option(
    "--draft-vocab",
    default="auto",
    show_default=True,
    help="Draft vocabulary size, or 'auto': the size with the best coverage for its measured cost.",
)
@click.option("--ttt-steps", type=click.IntRange(min=1), default=7, show_default=True)
@click.option("--lr", type=click.FloatRange(min=0, min_open=True), default=1e-3, show_default=True)
@click.option("--batch-tokens", type=click.IntRange(min=16), default=512, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--held-out", type=click.FloatRange(0, 0.5, min_open=True), default=0.05, show_default=True)
@click.option("--init-layer", type=click.IntRange(min=0), help="Start the head's layer from this target layer.")
@click.option("--init-lm-head", is_flag=True, help="Start the head's lm_head and norm from the target's.")
@click.option("--max-train-tokens", type=click.IntRange(min=1), help="Train on the first N tokens only (a curve).")
@click.option("--eval-every", type=click.IntRange(min=0), default=100, show_default=True, help="Steps; 0: at the end.")
@click.option("--eval-tokens", type=click.IntRange(min=1), default=12000, show_default=True)
@click.option("--checkpoint-minutes", type=click.FloatRange(min=0, min_open=True), default=5.0, show_default=True)
@click.option("--plot", type=click.Path(dir_okay=False, path_type=Path), help="PNG of loss and per-step accuracy.")
@click.option(
    "--feature-cache-mb",
    type=click.IntRange(min=0),
    default=3000,
    show_default=True,
    help="Memory for the target's features of conversations already seen (~3.6 KB a token): later epochs skip "
    "their prefill.",
)
@threads_option
def train_draft(
    config_path: Path | None,
    data: Path,
    work: Path,
    out: Path | None,
    minutes: float,
    draft_vocab: str,
    ttt_steps: int,
    lr: float,
    batch_tokens: int,
    seed: int,
    held_out: float,
    init_layer: int | None,
    init_lm_head: bool,
    max_train_tokens: int | None,
    eval_every: int,
    eval_tokens: int,
    checkpoint_minutes: float,
    plot: Path | None,
    feature_cache_mb: int,
    threads: int | None,
) -> None:
    """Train an EAGLE-3 head for the target on draft-data's conversations (resumable; --minutes per run)."""
    from neuron_ssp.tools.train_run import TrainRequest, run_training

    set_threads(threads)
    request = TrainRequest(
        config_path=config_path,
        data=data,
        work=work,
        out=out or work / "head",
        minutes=minutes,
        draft_vocab=parse_draft_vocab(draft_vocab),
        ttt_steps=ttt_steps,
        lr=lr,
        batch_tokens=batch_tokens,
        seed=seed,
        held_out=held_out,
        init_layer=init_layer,
        init_lm_head=init_lm_head,
        max_train_tokens=max_train_tokens,
        eval_every=eval_every,
        eval_tokens=eval_tokens,
        checkpoint_minutes=checkpoint_minutes,
        plot=plot,
        feature_cache_mb=feature_cache_mb,
    )
    run_training(request, console, status_console)


def parse_draft_vocab(value: str) -> int | None:
    """'auto' -> None; a positive integer otherwise."""
    if value == "auto":
        return None
    if value.isdigit() and int(value) > 0:
        return int(value)
    raise UsageError(Problem("--draft-vocab", value, "must be 'auto' or a positive integer", "e.g. --draft-vocab 8192"))
