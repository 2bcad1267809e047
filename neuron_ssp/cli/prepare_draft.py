"""`neuron-ssp prepare-draft`: a standard EAGLE-3 head -> the full-vocabulary head NxD Inference loads."""

from __future__ import annotations

from pathlib import Path

import click

DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


@click.command("prepare-draft")
@click.argument("head", metavar="HEAD")
@click.option(
    "--target",
    required=True,
    help="The target model's Hugging Face directory, or embedded:smollm2-135m-instruct (its embedding is copied "
    "into the head).",
)
@click.option("--out", "out_dir", required=True, type=click.Path(path_type=Path), help="Where to write the head.")
@click.option("--dtype", type=click.Choice(list(DTYPES)), default=None, help="Cast the weights (default: as read).")
def prepare_draft(head: str, target: str, out_dir: Path, dtype: str | None) -> None:
    """Widen an EAGLE-3 head (a checkpoint directory, or embedded:smollm2-135m-instruct-eagle3) for NxD Inference:
    the target's embedding copied in, lm_head over the whole vocabulary (greedy drafts unchanged), NxDI's tensor
    names. Point draft.path at OUT (speculation.drafter: eagle3, neuron.library: nxdi)."""
    import torch

    from neuron_ssp.embedded.heads import resolve_head_path
    from neuron_ssp.embedded.models import resolve_model_path
    from neuron_ssp.tools.prepare_draft import NOT_READ_BY, READ_BY
    from neuron_ssp.tools.prepare_draft import prepare_draft as prepare

    head_dir, target_dir = resolve_head_path(head, "HEAD"), resolve_model_path(target, "--target")
    prepared = prepare(head_dir, target_dir, out_dir, getattr(torch, DTYPES[dtype]) if dtype else None)
    click.echo(
        f"prepared {prepared.directory}: lm_head widened from {prepared.draft_vocab_size} to {prepared.vocab_size} "
        f"tokens, embedding {prepared.embedding}; set draft.path: {prepared.directory}\n"
        f"read by {', '.join(READ_BY)}; not by {' or '.join(NOT_READ_BY)}, which read the layer as midlayer.* "
        f"only and would drop it silently: give them the original head {head_dir}"
    )
