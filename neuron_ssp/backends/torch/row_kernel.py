"""The few-row fp32 kernels, built on this machine with its C compiler and loaded by ctypes.

row_kernel.c multiplies 1-64 rows by a weight matrix; llama_layer.c runs a whole Llama decoder layer on
them (norms, rotary, KV cache, attention, SiLU) around four such products, in one call; the rows may belong
to several sequences (segments), each attending to its own slot of the cache.

Why our own kernel: a speculative call scores 2-16 rows, where MKL's sgemm leaves its fast matrix-vector
path for a general GEMM (1.6-2.3x the one-row cost) and oneDNN's packed kernel still costs ~1.4x at 8
rows; a memory-bound model should pay about one read of its weights whatever the row count, and this
kernel does (benchmarks/gemm_rows.py prints all three side by side). The layer kernel removes the torch
dispatch between the products (~0.5 ms a layer at one row, a quarter of a call). Both are built once per machine with
`-march=native` (about a second) into the package cache, keyed by the source, the compiler and the CPU,
so a later run loads it at once. No compiler, or a failed build: `unavailable_reason()` says why and the
caller keeps oneDNN's packed kernel.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from neuron_ssp.embedded.cache import cache_root

SOURCES = tuple(Path(__file__).with_name(name) for name in ("row_kernel.c", "llama_layer.c"))
# floats after each head dimension's row of transposed keys: the rows of one slot then fall in different L1
# sets (unpadded, a 2048-slot cache puts them 8 KiB apart, all in one set: attention ran at L2 speed)
KEY_PADDING = 16
MAX_ROWS = 64  # beyond (a long prefill), MKL's GEMM on the weights as stored is as fast (gemm_rows.py)
# OpenMP first; a compiler without it (Apple's clang) still builds the one-thread kernel
FLAG_SETS = (("-O3", "-march=native", "-fopenmp"), ("-O3", "-march=native"))
DEFINES = (f"-DMAX_ROWS={MAX_ROWS}",)  # panel_linear's buffers: sized by the bound the checks below enforce


@dataclass(frozen=True)
class Panels:
    """An (out, in) matrix repacked for the kernel: column panels, each streamed once per call."""

    data: torch.Tensor
    out_features: int
    in_features: int


@dataclass(frozen=True)
class LayerShape:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    inter: int
    eps: float

    def scratch_floats(self, spans: Spans, query_block: int) -> int:
        """What llama_layer.c lays out in its scratch buffer for these segments: the rows' buffers, then one
        stretch per attention task (segment, kv head): its queries, their scores over its positions, and a block."""
        rows = spans.rows
        q_width = self.heads * self.head_dim
        fused = max(q_width + 2 * self.kv_heads * self.head_dim, 2 * self.inter)
        group = self.heads // self.kv_heads
        tasks = sum(
            count * group * (self.head_dim + start + count + 2) + query_block * self.head_dim
            for _, start, count in spans.segments
        )
        return rows * (2 * self.hidden + fused + max(q_width, self.inter)) + self.kv_heads * tasks


@dataclass(frozen=True)
class Spans:
    """The segments of one layer-kernel call, each (cache slot, first position, rows): segment i owns the next
    rows of x, in order; `table` is the (segments, 3) int32 array llama_layer.c reads."""

    segments: tuple[tuple[int, int, int], ...]
    table: torch.Tensor

    @classmethod
    def of(cls, segments: Sequence[tuple[int, int, int]]) -> Spans:
        spans = tuple(segments)
        return cls(spans, torch.tensor(spans, dtype=torch.int32).view(-1, 3))

    @property
    def rows(self) -> int:
        return sum(count for _, _, count in self.segments)


class RowKernel:
    def __init__(self, library: ctypes.CDLL):
        self._pack = library.pack_panels
        self._pack.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
        self._pack.restype = None
        self._linear = library.panel_linear
        self._linear.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int] * 4
        self._linear.restype = None
        self.panel_cols = int(library.panel_cols())
        self._layer = library.llama_layer
        self._layer.argtypes = (
            [ctypes.c_void_p, ctypes.c_int]
            + [ctypes.c_void_p] * 9
            + [ctypes.c_int, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_ssize_t]
            + [ctypes.c_void_p] * 2
            + [ctypes.c_int] * 5
            + [ctypes.c_float, ctypes.c_void_p, ctypes.c_int]
        )
        self._layer.restype = None
        self.query_block = int(library.query_block())

    def pack(self, weight: torch.Tensor) -> Panels:
        weight = weight.detach().contiguous()
        out_features, in_features = (int(size) for size in weight.shape)
        panels = -(-out_features // self.panel_cols)
        data = torch.empty(panels * self.panel_cols * in_features, dtype=torch.float32)
        self._pack(weight.data_ptr(), data.data_ptr(), out_features, in_features)
        return Panels(data, out_features, in_features)

    def layer(
        self,
        x: torch.Tensor,
        spans: Spans,
        matrices: tuple[Panels, Panels, Panels, Panels],
        norms: tuple[torch.Tensor, torch.Tensor],
        cache: tuple[torch.Tensor, torch.Tensor],
        rotary: tuple[torch.Tensor, torch.Tensor],
        shape: LayerShape,
    ) -> None:
        """One decoder layer on x (rows, hidden), in place: the four products once over all rows, attention per
        segment against its own slot, whose positions start.. get the segment's keys and values.
        `matrices`: q/k/v fused, o, gate/up fused, down; `cache`: keys (slots, kv_heads, head_dim, n_positions:
        transposed; rows may be padded, KEY_PADDING) and values (slots, kv_heads, n_positions, head_dim), each
        slot dense; `rotary`: cos and sign-folded sin tables (n_positions, head_dim)."""
        qkv, o, gate_up, down = matrices
        keys, values = cache
        key_stride = keys.stride(-2)
        if not (
            x.is_contiguous()
            and values.is_contiguous()
            and keys.shape[-1] == values.shape[-2]
            and keys.stride(-1) == 1
            and key_stride >= keys.shape[-1]
            and keys.stride(-3) == keys.shape[-2] * key_stride
            and keys.shape[0] == values.shape[0]
        ):
            raise ValueError("llama_layer.c reads x, the values and each head's keys as dense arrays")
        _check_spans(spans, x.shape[0], values.shape[0], values.shape[-2])
        scratch = torch.empty(shape.scratch_floats(spans, self.query_block), dtype=torch.float32)
        self._layer(
            x.data_ptr(),
            len(spans.segments),
            spans.table.data_ptr(),
            norms[0].data_ptr(),
            qkv.data.data_ptr(),
            o.data.data_ptr(),
            norms[1].data_ptr(),
            gate_up.data.data_ptr(),
            down.data.data_ptr(),
            keys.data_ptr(),
            values.data_ptr(),
            key_stride,
            keys.stride(0),
            values.shape[-2],
            values.stride(0),
            rotary[0].data_ptr(),
            rotary[1].data_ptr(),
            shape.hidden,
            shape.heads,
            shape.kv_heads,
            shape.head_dim,
            shape.inter,
            shape.eps,
            scratch.data_ptr(),
            torch.get_num_threads(),
        )

    def linear(self, x: torch.Tensor, panels: Panels) -> torch.Tensor:
        """x (rows <= MAX_ROWS, in) fp32 -> (rows, out)."""
        x = x.contiguous()
        if x.dim() != 2 or x.shape[1] != panels.in_features or x.shape[0] > MAX_ROWS:
            raise ValueError(
                f"x is {tuple(x.shape)}, the matrix takes {panels.in_features} inputs a row, "
                f"at most {MAX_ROWS} rows a call"
            )
        y = torch.empty(x.shape[0], panels.out_features, dtype=torch.float32)
        self._linear(
            x.data_ptr(),
            panels.data.data_ptr(),
            y.data_ptr(),
            x.shape[0],
            panels.out_features,
            panels.in_features,
            torch.get_num_threads(),
        )
        return y


def _check_spans(spans: Spans, rows: int, slots: int, n_positions: int) -> None:
    """What C does not check: it would write past the cache or its buffers."""
    if spans.rows != rows or rows > MAX_ROWS:  # panel_linear's buffers hold MAX_ROWS rows
        raise ValueError(f"{rows} rows for segments of {spans.rows}: the layer kernel takes at most {MAX_ROWS} a call")
    for slot, start, count in spans.segments:
        if not 0 <= slot < slots:
            raise IndexError(f"cache slot {slot} is outside the cache's {slots}")
        if start < 0 or start + count > n_positions:
            raise IndexError(f"cache positions {start}..{start + count - 1} are outside the cache's {n_positions}")


@functools.cache
def row_kernel() -> RowKernel | None:
    """The kernel for this machine, or None (see unavailable_reason)."""
    built = _built()
    return RowKernel(built) if isinstance(built, ctypes.CDLL) else None


def unavailable_reason() -> str | None:
    built = _built()
    return built if isinstance(built, str) else None


@functools.cache
def _built() -> ctypes.CDLL | str:
    """The loaded library, or why there is none."""
    if os.environ.get("NEURON_SSP_ROW_KERNEL", "1") == "0":
        return "NEURON_SSP_ROW_KERNEL=0"
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None:
        return f"no C compiler ({os.environ.get('CC', 'cc')}) on PATH: install gcc (apt-get install gcc)"
    key = _build_key(compiler)
    target = cache_root() / "kernels" / f"row_kernel-{key}.so"
    if not target.exists():
        failure = _compile(compiler, target)
        if failure is not None:
            return failure
    try:
        return ctypes.CDLL(str(target))
    except OSError as err:
        return f"{target} does not load: {err}"


def _compile(compiler: str, target: Path) -> str | None:
    """Build into a temporary file, then rename: two processes building at once both end with a whole file."""
    target.parent.mkdir(parents=True, exist_ok=True)
    errors = ""
    for flags in FLAG_SETS:
        with tempfile.NamedTemporaryFile(dir=target.parent, suffix=".so", delete=False) as partial:
            pass
        result = subprocess.run(
            [compiler, *flags, *DEFINES, "-shared", "-fPIC", *map(str, SOURCES), "-o", partial.name, "-lm"],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode == 0:
            os.replace(partial.name, target)
            return None
        os.unlink(partial.name)
        errors = result.stderr.strip().splitlines()[-1] if result.stderr.strip() else f"exit {result.returncode}"
    return f"{compiler} could not build {', '.join(source.name for source in SOURCES)}: {errors}"


def _build_key(compiler: str) -> str:
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=False).stdout
    digest = hashlib.sha256(b"".join(source.read_bytes() for source in SOURCES))
    for part in (compiler, version, platform.machine(), _cpu_identity(), repr(FLAG_SETS), repr(DEFINES)):
        digest.update(part.encode())
    return digest.hexdigest()[:16]


def _cpu_identity() -> str:
    """What -march=native depends on: the CPU model and its feature flags (Linux); the machine elsewhere."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor()
    return "\n".join(sorted({line for line in lines if line.startswith(("model name", "flags", "Features"))}))
