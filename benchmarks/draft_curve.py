"""The learning curve of train-draft's heads: held-out acceptance against training tokens, one held-out set.

Every head (a directory train-draft wrote, recipe.json beside it) is evaluated on the SAME held-out
conversations of the data directory (train-draft's hash split, which no run trains on): per-step top-1
accuracy over every answer, and tau (Spec-Bench's mean accepted length) walked through the greedy
answers, beside prompt lookup's tau on the same answers (tools/draft_eval.py).

    python benchmarks/draft_curve.py out/runs/r40k/head out/runs/r100k/head --json curve.json --plot curve.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from neuron_ssp.cli.draft import DEFAULT_DATA_DIR
from neuron_ssp.config import load_config
from neuron_ssp.drafters.eagle_checkpoint import read_checkpoint
from neuron_ssp.drafters.eagle_head import EagleHead
from neuron_ssp.tools.draft_data import load_conversations
from neuron_ssp.tools.draft_eval import evaluate
from neuron_ssp.tools.draft_plots import init_label, plot_curve
from neuron_ssp.tools.train_draft import RECIPE_FILE, split
from neuron_ssp.tools.train_run import held_out_batches, target_backend


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("heads", nargs="+", type=Path)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--held-out", type=float, default=0.05)
    parser.add_argument("--eval-tokens", type=int, default=20000)
    parser.add_argument("--steps", type=int, default=5, help="chain steps evaluated (windows up to steps + 1)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--plot", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)
    conversations = load_conversations(args.data)
    _, held = split(conversations, args.held_out, None)
    config = load_config(None, {"target.n_positions": max(len(ids) for ids in conversations.ids) + 8})
    backend = target_backend(config, 8)
    windows = tuple(k for k in (2, 3, 4, 5, 6, 8) if k <= args.steps + 1)
    points = []
    features: dict[tuple, list] = {}  # held-out batches per (taps, draft vocabulary): heads often share them
    for directory in args.heads:
        checkpoint = read_checkpoint(directory)
        head = EagleHead.from_checkpoint(checkpoint, backend.model.get_input_embeddings().weight.detach())
        taps = tuple(checkpoint.config.taps or ())
        backend.set_taps(list(taps))
        recipe = json.loads((directory / RECIPE_FILE).read_text())
        key = (taps, tuple(head.target_ids.tolist()))
        if key not in features:
            features[key] = held_out_batches(backend, conversations, held, head.target_ids, args.eval_tokens, 2048)
        batches = features[key]
        result = evaluate(head, batches, args.steps, windows)
        point = {
            "head": str(directory),
            "label": init_label(recipe["settings"]),
            "train_tokens": recipe["train_tokens"],
            "epochs": recipe["epochs"],
            "draft_vocab": int(head.target_ids.shape[0]),
            **result.to_dict(),
        }
        points.append(point)
        print(
            f"{directory} ({point['label']}, draft vocabulary {point['draft_vocab']}): "
            f"{recipe['train_tokens']:,} training tokens, {recipe['epochs']} epochs; "
            f"held out {result.tokens:,} tokens ({result.greedy_answers} greedy answers)"
        )
        print("  accuracy per step   " + " ".join(f"{a:.3f}" for a in result.accuracy))
        print("  conditional         " + " ".join(f"{a:.3f}" for a in result.conditional))
        print("  tau head  (k)       " + " ".join(f"{k}: {v:.3f}" for k, v in result.tau.items()))
        print("  tau ngram (k)       " + " ".join(f"{k}: {v:.3f}" for k, v in result.ngram_tau.items()))
    if args.json:
        args.json.write_text(json.dumps(points, indent=2) + "\n")
    if args.plot:
        plot_curve(points, args.plot, f"held-out acceptance against training tokens ({args.data.name})")


if __name__ == "__main__":
    main()
