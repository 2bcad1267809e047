"""The few-row fp32 kernels, built on this machine with its C compiler and loaded by ctypes.

row_kernel.c multiplies 1-64 rows by a weight matrix; llama_layer.c runs a whole Llama decoder layer on
them (norms, rotary, KV cache, attention, SiLU) around four such products, in one call; the rows may belong
to several sequences (segments), each attending to its own slot of the cache.

Why our own kernel: a speculative call scores 2-16 rows, where MKL's sgemm leaves its fast matrix-vector
path for a general GEMM (1.6-2.3x the one-row cost) and oneDNN's packed kernel still costs ~1.4x at 8
rows; a memory-bound model should pay about one read of its weights whatever the row count, and this
kernel does (benchmarks/gemm_rows.py prints all three side by side). The layer kernel removes the torch
dispatch between the products (~0.5 ms a layer at one row, a quarter of a call). Both are built once per machine with
`-march=native` (~10 s, most of it `llama_layer.c`'s attention: one copy per query count and vector width)
into the package cache, keyed by the source, the compiler and the CPU,
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

import numpy as np
import torch

from neuron_ssp.backends.torch.gguf_blocks import FORMAT_Q4, GROUP, BlockMatrix
from neuron_ssp.embedded.cache import cache_root, first_use_status

SOURCES = tuple(Path(__file__).with_name(name) for name in ("row_kernel.c", "llama_layer.c"))
KEY_TILE = 16  # positions per key tile of the cache (llama_layer.c's TILE, checked when the library loads)
MAX_ROWS = 64  # beyond (a long prefill), MKL's GEMM on the weights as stored is as fast (gemm_rows.py)
# OpenMP first; a compiler without it (Apple's clang) still builds the one-thread kernel
FLAG_SETS = (("-O3", "-march=native", "-fopenmp"), ("-O3", "-march=native"))
DEFINES = (f"-DMAX_ROWS={MAX_ROWS}",)  # panel_linear's buffers: sized by the bound the checks below enforce
KV_DTYPES = (torch.float32, torch.bfloat16)  # what the layer kernel's cache may hold
FORMAT_F32 = 0  # row_kernel.c's weight formats: fp32 panels, or gguf_blocks.FORMAT_Q4 / FORMAT_Q8 block panels


@dataclass(frozen=True)
class Panels:
    """An (out, in) matrix repacked for the kernel: column panels, each streamed once per call; `format` FORMAT_F32
    (fp32 values) or a GGUF block format (gguf_blocks.py: quants with their scales, de-quantised in registers)."""

    data: torch.Tensor
    out_features: int
    in_features: int
    format: int = FORMAT_F32


@dataclass(frozen=True)
class LayerShape:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    inter: int
    eps: float


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


@dataclass(frozen=True)
class LayerCache:
    """One decoder layer's KV cache as llama_layer.c lays it out: keys (slots, kv_heads, tiles, head_dim, KEY_TILE),
    tiles = ceil(n_positions / KEY_TILE), so a tile of positions is contiguous; values (slots, kv_heads, n_positions,
    head_dim); fp32 or bf16."""

    keys: torch.Tensor
    values: torch.Tensor

    def standard_keys(self) -> torch.Tensor:
        """The keys as (slots, kv_heads, n_positions, head_dim), a copy."""
        slots, kv_heads, tiles, head_dim, tile = self.keys.shape
        keys = self.keys.transpose(-1, -2).reshape(slots, kv_heads, tiles * tile, head_dim)
        return keys[:, :, : self.values.shape[2]]


def key_tiles(n_positions: int) -> int:
    """Tiles of KEY_TILE positions that hold n_positions."""
    return -(-n_positions // KEY_TILE)


def allocate_caches(
    layers: int, slots: int, kv_heads: int, n_positions: int, head_dim: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Zeroed keys and values of `layers` layers laid out as LayerCache says, one tensor each (layer first)."""
    keys = torch.zeros(layers, slots, kv_heads, key_tiles(n_positions), head_dim, KEY_TILE, dtype=dtype)
    return keys, torch.zeros(layers, slots, kv_heads, n_positions, head_dim, dtype=dtype)


class _LayerWeights(ctypes.Structure):
    _fields_ = [(name, ctypes.c_void_p) for name in ("attn_norm", "qkv", "o", "mlp_norm", "gate_up", "down")] + [
        ("formats", ctypes.c_int * 4),
        ("keys", ctypes.c_void_p),
        ("values", ctypes.c_void_p),
    ]


class _Model(ctypes.Structure):
    _fields_ = [
        ("layers", ctypes.POINTER(_LayerWeights)),
        *[(name, ctypes.c_int) for name in ("layer_count", "hidden", "heads", "kv_heads", "head_dim", "inter")],
        ("eps", ctypes.c_float),
        ("n_positions", ctypes.c_int),
        ("kv_bf16", ctypes.c_int),
        ("cos", ctypes.c_void_p),
        ("sin", ctypes.c_void_p),
    ]


class _Call(ctypes.Structure):
    _fields_ = [
        ("model", ctypes.POINTER(_Model)),
        ("x", ctypes.c_void_p),
        ("rows", ctypes.c_int),
        ("segments", ctypes.c_int),
        ("spans", ctypes.c_void_p),
        ("scratch", ctypes.c_void_p),
        ("threads", ctypes.c_int),
    ]


# one decoder layer as the layer kernel takes it: q/k/v fused, o, gate/up fused, down; the two norms; its cache
KernelLayer = tuple[tuple[Panels, Panels, Panels, Panels], tuple[torch.Tensor, torch.Tensor], LayerCache]


class KernelModel:
    """What llama_layer.c reads on every call of one model, gathered once: each layer's panels, norms and cache,
    the shape, the rotary tables. It holds the tensors the C structure points to, and a scratch buffer that
    grows to the largest call so far."""

    def __init__(
        self,
        kernel: RowKernel,
        layers: Sequence[KernelLayer],
        rotary: tuple[torch.Tensor, torch.Tensor],
        shape: LayerShape,
    ):
        self.kernel = kernel
        self.shape = shape
        self.caches = [cache for _, _, cache in layers]
        self.slots, _, self.n_positions, _ = (int(size) for size in self.caches[0].values.shape)
        self.kv_dtype = self.caches[0].values.dtype
        _check_caches(self.caches, self.slots, shape, self.n_positions, self.kv_dtype)
        self._held = [rotary, layers]
        weights = (_LayerWeights * len(layers))()
        for entry, (matrices, norms, cache) in zip(weights, layers, strict=True):
            qkv, o, gate_up, down = matrices
            entry.attn_norm, entry.mlp_norm = norms[0].data_ptr(), norms[1].data_ptr()
            entry.qkv, entry.o, entry.gate_up, entry.down = (m.data.data_ptr() for m in (qkv, o, gate_up, down))
            entry.formats[:] = [m.format for m in (qkv, o, gate_up, down)]
            entry.keys, entry.values = cache.keys.data_ptr(), cache.values.data_ptr()
        self._weights = weights
        self.struct = _Model(
            weights,
            len(layers),
            shape.hidden,
            shape.heads,
            shape.kv_heads,
            shape.head_dim,
            shape.inter,
            shape.eps,
            self.n_positions,
            int(self.kv_dtype == torch.bfloat16),
            rotary[0].data_ptr(),
            rotary[1].data_ptr(),
        )
        self._scratch = torch.empty(0, dtype=torch.float32)

    def call(self, x: torch.Tensor, spans: Spans) -> KernelCall:
        """A call of these rows and segments, checked, its scratch ready: run it layer range by layer range."""
        if not x.is_contiguous() or x.dtype != torch.float32 or x.dim() != 2 or x.shape[1] != self.shape.hidden:
            raise ValueError(f"x must be a dense fp32 (rows, {self.shape.hidden}) array, not {tuple(x.shape)}")
        _check_spans(spans, x.shape[0], self.slots, self.n_positions)
        struct = _Call(
            ctypes.pointer(self.struct),
            x.data_ptr(),
            x.shape[0],
            len(spans.segments),
            spans.table.data_ptr(),
            None,
            torch.get_num_threads(),
        )
        floats = self.kernel.scratch_floats(struct)
        if self._scratch.numel() < floats:
            self._scratch = torch.empty(floats, dtype=torch.float32)
        struct.scratch = self._scratch.data_ptr()
        return KernelCall(self.kernel, struct, (x, spans, self))


@dataclass(frozen=True)
class KernelCall:
    """One checked call: `run(first, last)` runs those decoder layers on its rows, in place."""

    kernel: RowKernel
    struct: _Call
    held: tuple[object, ...]  # x, the spans and the model the structure points into

    def run(self, first: int, last: int) -> None:
        if not 0 <= first <= last <= self.struct.model.contents.layer_count:
            raise IndexError(f"layers {first}..{last - 1} of {self.struct.model.contents.layer_count}")
        self.kernel._layers(ctypes.byref(self.struct), first, last)


class RowKernel:
    def __init__(self, library: ctypes.CDLL):
        self._pack = library.pack_panels
        self._pack.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
        self._pack.restype = None
        self._linear = library.matrix_linear
        self._linear.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p] + [ctypes.c_int] * 4
        self._linear.restype = None
        self.panel_cols = int(library.panel_cols())
        self.lanes = int(library.kernel_lanes())
        self._group_bytes = library.block_group_bytes
        self._group_bytes.argtypes = [ctypes.c_int]
        self._layers = library.llama_layers
        self._layers.argtypes = [ctypes.POINTER(_Call), ctypes.c_int, ctypes.c_int]
        self._layers.restype = None
        self._scratch = library.llama_scratch_floats
        self._scratch.argtypes = [ctypes.POINTER(_Call)]
        self._scratch.restype = ctypes.c_ssize_t
        if int(library.key_tile()) != KEY_TILE:
            raise RuntimeError(
                f"llama_layer.c tiles keys by {library.key_tile()} positions, row_kernel.py by {KEY_TILE}"
            )

    def pack(self, weight: torch.Tensor) -> Panels:
        weight = weight.detach().contiguous()
        out_features, in_features = (int(size) for size in weight.shape)
        panels = -(-out_features // self.panel_cols)
        data = torch.empty(panels * self.panel_cols * in_features, dtype=torch.float32)
        self._pack(weight.data_ptr(), data.data_ptr(), out_features, in_features)
        return Panels(data, out_features, in_features)

    def pack_blocks(self, matrix: BlockMatrix) -> Panels:
        """A GGUF block matrix as row_kernel.c's block panels: per panel of panel_cols outputs, per group of GROUP
        inputs, the outputs' scales (fp32), their offsets (Q4), then the group's quants step by step (Q4: two a
        byte, per vector of `lanes` outputs byte j holding output j low and output j + lanes / 2 high)."""
        rows, inputs = matrix.shape
        cols, groups = self.panel_cols, inputs // GROUP
        panels = -(-rows // cols)

        def by_panel(per_row: np.ndarray) -> np.ndarray:
            """(rows, groups, ...) -> (panels, groups, cols, ...), zero past the last row."""
            padded = np.zeros((panels * cols, *per_row.shape[1:]), dtype=per_row.dtype)
            padded[:rows] = per_row
            return padded.reshape(panels, cols, *per_row.shape[1:]).swapaxes(1, 2)

        parts = [np.ascontiguousarray(by_panel(matrix.scales)).view(np.uint8)]
        if matrix.offsets is not None:
            parts.append(np.ascontiguousarray(by_panel(matrix.offsets)).view(np.uint8))
        steps = by_panel(matrix.quants.reshape(rows, groups, GROUP)).swapaxes(2, 3)  # (panels, groups, GROUP, cols)
        if matrix.format == FORMAT_Q4:
            halves = steps.reshape(panels, groups, GROUP, cols // self.lanes, 2, self.lanes // 2)
            steps = halves[..., 0, :] | (halves[..., 1, :] << 4)
        parts.append(np.ascontiguousarray(steps).reshape(panels, groups, -1).view(np.uint8))
        packed = np.concatenate(parts, axis=-1)
        if packed.shape[-1] != int(self._group_bytes(matrix.format)):
            raise RuntimeError(
                f"{packed.shape[-1]} bytes a group packed, row_kernel.c reads {self._group_bytes(matrix.format)}"
            )
        return Panels(torch.from_numpy(packed.reshape(-1).copy()), rows, inputs, matrix.format)

    def model(
        self, layers: Sequence[KernelLayer], rotary: tuple[torch.Tensor, torch.Tensor], shape: LayerShape
    ) -> KernelModel:
        """The decoder layers (q/k/v fused, o, gate/up fused, down; the two norms; the cache), the rotary tables
        cos and sign-folded sin (n_positions, head_dim), gathered for llama_layer.c once."""
        return KernelModel(self, layers, rotary, shape)

    def scratch_floats(self, call: _Call) -> int:
        return int(self._scratch(ctypes.byref(call)))

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
            panels.format,
            y.data_ptr(),
            x.shape[0],
            panels.out_features,
            panels.in_features,
            torch.get_num_threads(),
        )
        return y


def _check_caches(
    caches: Sequence[LayerCache], slots: int, shape: LayerShape, n_positions: int, dtype: torch.dtype
) -> None:
    """What C does not check: every layer's cache dense, of one shape and dtype, laid out as LayerCache says."""
    tiles = key_tiles(n_positions)
    keys_shape = (slots, shape.kv_heads, tiles, shape.head_dim, KEY_TILE)
    values_shape = (slots, shape.kv_heads, n_positions, shape.head_dim)
    for cache in caches:
        if not (
            cache.keys.is_contiguous()
            and cache.values.is_contiguous()
            and tuple(cache.keys.shape) == keys_shape
            and tuple(cache.values.shape) == values_shape
            and cache.keys.dtype == cache.values.dtype == dtype
            and dtype in KV_DTYPES
        ):
            raise ValueError(
                f"llama_layer.c reads each layer's cache as dense keys {keys_shape} and values {values_shape}, "
                f"float32 or bfloat16, one dtype"
            )


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
        with first_use_status(f"Building the CPU row kernel once (~10 s) into {target.parent}"):
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
