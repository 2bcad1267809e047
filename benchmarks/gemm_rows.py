"""What the matrix products of one call cost per row count, by weight layout, in ONE run.

The 30 layers' matrices of SmolLM2-135M (q/k/v fused 960x576, o 576x576, gate/up fused 3072x576,
down 576x1536; random weights of the same shapes, 425 MB, more than the caches hold) are applied to
1, 2, 4, 8 and 16 rows: MKL as stored (F.linear), a contiguous transposed copy (x @ Wt), oneDNN's
packed layout for several row hints (`torch.ops.mkldnn._reorder_linear_weight`) and our row kernel's
panels (row_kernel.c, where a C compiler builds it). With --inductor, 20
stacked 3072x576 linears also go through torch.compile with freezing and max-autotune (its C++ GEMM
template against MKL's packed GEMM; needs g++), compiled per row count: whether compiling buys a
cheaper wide call than packing does.

    python benchmarks/gemm_rows.py [--inductor]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812

from neuron_ssp.backends.torch.row_kernel import row_kernel

ROWS = (1, 2, 4, 8, 16)
LAYER = ((960, 576), (576, 576), (3072, 576), (576, 1536))
LAYERS = 30


def timed(
    apply: Callable[[torch.Tensor, Any], torch.Tensor],
    weights: list[Any],
    inputs: list[int],
    rows: int,
    repeats: int = 5,
) -> float:
    """Median ms of applying every matrix once to `rows` rows, after one uncounted pass."""
    xs = {n: torch.randn(rows, n) for n in set(inputs)}
    samples = []
    for turn in range(repeats + 1):
        begin = time.perf_counter()
        for weight, n in zip(weights, inputs, strict=True):
            apply(xs[n], weight)
        if turn:
            samples.append(1000.0 * (time.perf_counter() - begin))
    return statistics.median(samples)


def layouts() -> None:
    torch.manual_seed(0)
    weights = [torch.randn(out, n) * 0.02 for _ in range(LAYERS) for out, n in LAYER]
    inputs = [int(w.shape[1]) for w in weights]
    results: dict[str, list[float]] = {}
    with torch.inference_mode():
        results["F.linear (as stored)"] = [timed(F.linear, weights, inputs, m) for m in ROWS]
        transposed = [w.t().contiguous() for w in weights]
        results["x @ Wt (transposed)"] = [timed(lambda x, t: x @ t, transposed, inputs, m) for m in ROWS]
        del transposed
        for hint in (1, 8, 16, 64):
            packed = [torch.ops.mkldnn._reorder_linear_weight(w, hint) for w in weights]
            results[f"oneDNN packed, hint {hint}"] = [
                timed(lambda x, p: torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], ""), packed, inputs, m)
                for m in ROWS
            ]
            del packed
        kernel = row_kernel()
        if kernel is not None:
            panels = [kernel.pack(w) for w in weights]
            results["row kernel (panels)"] = [timed(kernel.linear, panels, inputs, m) for m in ROWS]
    flops = 2 * sum(w.numel() for w in weights)
    print(
        f"{LAYERS} layers' matrices ({sum(w.numel() for w in weights) * 4 / 1e6:.0f} MB fp32), median ms per pass, "
        f"{torch.get_num_threads()} thread(s)"
    )
    print(f"{'layout':<26}" + "".join(f"{'rows ' + str(m):>9}" for m in ROWS) + "   8 ÷ 1   GFLOP/s at 8")
    for name, ms in results.items():
        print(
            f"{name:<26}"
            + "".join(f"{t:>9.1f}" for t in ms)
            + f"   {ms[3] / ms[0]:>4.2f}x   {8 * flops / ms[3] / 1e6:>6.1f}"
        )


def inductor() -> None:
    import torch._inductor.config as inductor_config

    inductor_config.freezing = True
    inductor_config.max_autotune = True
    inductor_config.max_autotune_gemm_backends = "CPP,ATEN"
    stack = torch.nn.ModuleList([torch.nn.Linear(576, 3072, bias=False) for _ in range(20)]).eval()

    def forward(x: torch.Tensor) -> list[torch.Tensor]:
        return [linear(x) for linear in stack]

    print("\n20 stacked 3072x576 linears, median ms (compiled per row count, freezing + max-autotune)")
    with torch.no_grad():
        for rows in (1, 8):
            x = torch.randn(rows, 576)
            compiled = torch.compile(forward)
            begin = time.perf_counter()
            compiled(x)
            compile_s = time.perf_counter() - begin
            eager = statistics.median(_times(forward, x))
            fast = statistics.median(_times(compiled, x))
            print(f"rows {rows}: eager {eager:.1f}, compiled {fast:.1f} (compile {compile_s:.1f} s)")
            torch._dynamo.reset()


def _times(fn: Callable[[torch.Tensor], object], x: torch.Tensor, repeats: int = 15) -> list[float]:
    samples = []
    for _ in range(repeats):
        begin = time.perf_counter()
        fn(x)
        samples.append(1000.0 * (time.perf_counter() - begin))
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--inductor", action="store_true", help="also time torch.compile (needs g++)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    layouts()
    if args.inductor:
        inductor()


if __name__ == "__main__":
    main()
