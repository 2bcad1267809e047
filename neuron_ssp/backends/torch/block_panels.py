"""A GGUF's matrices as the row kernel's block panels, packed once per file and kernel geometry into the cache.

Reading a GGUF means parsing all its metadata first (the embedded model's 49k-token vocabulary: seconds), and
repacking 121 matrices takes one more; a load that finds the packed panels in the cache reads ~112 MB instead.
The entry is keyed by the GGUF's name and size and by the kernel's panel width and vector lanes (what `-march=native`
gives this CPU), and written under a temporary name then renamed, so a crash never leaves half an entry.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from safetensors import safe_open
from safetensors.torch import save_file

from neuron_ssp.backends.torch.gguf_blocks import GGUF_NAMES, GgufBlocks
from neuron_ssp.backends.torch.row_kernel import Panels, RowKernel
from neuron_ssp.embedded.cache import cache_root, first_use_status

PACKING_VERSION = 1  # bump when row_kernel.c's block layout changes
HEAD = "head"


def block_panels(gguf_path: Path, heads: int, kv_heads: int, layers: int, kernel: RowKernel) -> dict[str, Panels]:
    """Every block matrix of the GGUF packed for `kernel`: "<layer>.<qkv|o|gate_up|down>" and "head"; a matrix of
    another type (F16, a K-quant) is absent, and the fp32 path serves it."""
    key = f"{gguf_path.stem}-{gguf_path.stat().st_size}-{kernel.panel_cols}x{kernel.lanes}-v{PACKING_VERSION}"
    entry = cache_root() / "block-panels" / f"{key}.safetensors"
    if entry.exists():
        return _read(entry)
    with first_use_status(f"Repacking {gguf_path.name}'s quantised blocks for the row kernel once into {entry.parent}"):
        panels = packed(GgufBlocks(gguf_path, heads, kv_heads), layers, kernel)
        _write(entry, panels)
    return panels


def packed(blocks: GgufBlocks, layers: int, kernel: RowKernel) -> dict[str, Panels]:
    """Every block matrix of `blocks` packed for `kernel`, by the names llama_weights reads."""
    matrices = {f"{i}.{name}": blocks.layer(i, name) for i in range(layers) for name in GGUF_NAMES}
    matrices[HEAD] = blocks.head()
    return {name: kernel.pack_blocks(matrix) for name, matrix in matrices.items() if matrix is not None}


def _write(entry: Path, panels: dict[str, Panels]) -> None:
    entry.parent.mkdir(parents=True, exist_ok=True)
    shapes = {name: f"{p.out_features},{p.in_features},{p.format}" for name, p in panels.items()}
    with tempfile.NamedTemporaryFile(dir=entry.parent, suffix=".partial", delete=False) as partial:
        pass
    try:
        save_file({name: p.data for name, p in panels.items()}, partial.name, metadata=shapes)
        os.replace(partial.name, entry)
    finally:
        if os.path.exists(partial.name):
            os.unlink(partial.name)


def _read(entry: Path) -> dict[str, Panels]:
    """The panels and their shapes (the file's metadata), in one pass over the file."""
    panels = {}
    with safe_open(str(entry), framework="pt") as handle:
        for name, shape in (handle.metadata() or {}).items():  # one entry per tensor, written by _write
            out_features, in_features, form = (int(part) for part in shape.split(","))
            panels[name] = Panels(handle.get_tensor(name), out_features, in_features, form)
    return panels
