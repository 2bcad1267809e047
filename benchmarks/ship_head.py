"""Put a head trained by train-draft into the package as `embedded:smollm2-135m-instruct-eagle3`.

Copies the head's config.json, model.safetensors (fp16) and recipe.json into
neuron_ssp/data/smollm2-135m-instruct-eagle3/ and records its known answer there (drafters/head_answer.py:
the target's greedy token after a fixed prompt, then the head's greedy chain), which every load of the
shipped head checks. Refuses a head over 25 MB or not in fp16.

    python benchmarks/ship_head.py out/runs/r300k/head
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import torch
from transformers import AutoTokenizer

from neuron_ssp.backends.torch.load import load_torch_backends
from neuron_ssp.config import EMBEDDED_EAGLE3, load_config
from neuron_ssp.drafters.eagle import EagleModel
from neuron_ssp.drafters.eagle_checkpoint import WEIGHTS_FILE, read_checkpoint
from neuron_ssp.drafters.head_answer import check_head_answer, record_head_answer
from neuron_ssp.embedded.heads import EMBEDDED_HEADS
from neuron_ssp.embedded.models import resolve_model_path
from neuron_ssp.tools.train_draft import RECIPE_FILE

MAX_BYTES = 25 * 2**20
FILES = ("config.json", WEIGHTS_FILE, RECIPE_FILE)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("head", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)
    checkpoint = read_checkpoint(args.head)
    size = (args.head / WEIGHTS_FILE).stat().st_size
    if size > MAX_BYTES or checkpoint.tensors["lm_head.weight"].dtype != torch.float16:
        raise SystemExit(
            f"{args.head}: {size / 2**20:.1f} MB, {checkpoint.tensors['lm_head.weight'].dtype}: "
            "the package ships fp16 heads of at most 25 MB"
        )
    target_dir, _ = EMBEDDED_HEADS[EMBEDDED_EAGLE3]
    target_dir.mkdir(parents=True, exist_ok=True)
    for name in FILES:
        shutil.copyfile(args.head / name, target_dir / name)
    config = load_config(None)
    target, _, _ = load_torch_backends(config, 1)
    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model_path(config.target.path, "target.path")))
    model = EagleModel(read_checkpoint(target_dir), target)
    tokens = record_head_answer(model, target, tokenizer, target_dir)
    check_head_answer(model, target, tokenizer, EMBEDDED_EAGLE3)
    print(f"shipped {args.head} as {EMBEDDED_EAGLE3} in {target_dir} ({size / 2**20:.1f} MB); known answer {tokens}")


if __name__ == "__main__":
    main()
