"""What one target call costs per window width, for each way the torch backend can score, in ONE run.

Paths, each a TorchBackend over the same loaded model (the embedded default unless --config says
otherwise): Hugging Face's forward with its DynamicCache (the backend before the compact forward), our compact
forward with the weights as stored, with oneDNN's packed kernel from three rows on (the default on a CPU
in fp32 before the row kernel, and still where no C compiler builds it), with the row kernel (the
default), and with --compile the compact forward through torch.compile. Every round times each path's
prefill, then each width once, the paths and widths in an order that rotates per round, so load on a
shared machine hits them alike; the table gives medians, each width's cost ÷ that path's width-1 cost
(what speculation pays for a wide call) and ÷ the Hugging Face path's width-1 cost (what it costs
against the backend before). The LM head is timed alone too: as stored (F.linear), as a contiguous
transposed copy (x @ Wt), oneDNN-packed and through the row kernel.

    python benchmarks/scoring_speed.py --threads 1 [--rounds 12] [--widths 1,2,3,4,6,8,12,16]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F  # noqa: N812

from neuron_ssp.backends.torch.llama_forward import CompactLlama
from neuron_ssp.backends.torch.llama_weights import PACK_ROWS_HINT, Linears
from neuron_ssp.backends.torch.row_kernel import row_kernel
from neuron_ssp.backends.torch.scoring import TorchBackend
from neuron_ssp.config import load_config
from neuron_ssp.pipeline.load import load_pipeline
from neuron_ssp.speculation.call_cost import WidthTimer
from neuron_ssp.tools.prompt_set import DEFAULT_PROMPTS, load_prompts


class OneDnnPacked(Linears):
    """oneDNN's packed kernel from three rows on, F.linear as stored below, torch ops between: the forward
    without the row kernel (where no C compiler builds it)."""

    def __init__(self, linears: Linears):
        self.__dict__.update(linears.__dict__)
        self.kernel = self.panels = None
        self.packed = torch.ops.mkldnn._reorder_linear_weight(torch.cat(self.weights).contiguous(), PACK_ROWS_HINT)


def onednn_packed(backend: TorchBackend) -> TorchBackend:
    weights = backend._forward.w
    layers = [
        dataclasses.replace(
            layer, **{name: OneDnnPacked(getattr(layer, name)) for name in ("qkv", "o", "gate_up", "down")}
        )
        for layer in weights.layers
    ]
    onednn = dataclasses.replace(weights, layers=layers, head=OneDnnPacked(weights.head), layout="oneDNN packed")
    backend._forward = CompactLlama(onednn, backend.model.model.rotary_emb, backend.n_positions)
    return backend


def paths(model: torch.nn.Module, n_positions: int, compile: bool) -> dict[str, TorchBackend]:
    chosen = {
        "hf (before)": TorchBackend(model, n_positions, forward="hf"),
        "compact, as stored": TorchBackend(model, n_positions, pack=False),
        "compact, oneDNN": onednn_packed(TorchBackend(model, n_positions, pack=True)),
        "compact, row kernel": TorchBackend(model, n_positions, pack=True),
    }
    if compile:
        chosen["compact, compiled"] = TorchBackend(model, n_positions, compile=True)
    return chosen


def curve_table(costs: dict[str, dict[int, float]], prefill: dict[str, float]) -> None:
    widths = sorted(next(iter(costs.values())))
    base = costs["hf (before)"][1]
    print(f"{'path':<20}{'prefill ms':>11} " + " ".join(f"{'w' + str(w):>7}" for w in widths))
    for name, ms in costs.items():
        print(f"{name:<20}{prefill[name]:>11.1f} " + " ".join(f"{ms[w]:>7.1f}" for w in widths) + "  ms")
        print(f"{'':<32}" + " ".join(f"{ms[w] / ms[1]:>6.2f}x" for w in widths) + "  ÷ own width 1")
        print(f"{'':<32}" + " ".join(f"{ms[w] / base:>6.2f}x" for w in widths) + "  ÷ hf width 1")


def lm_head_table(model: torch.nn.Module, widths: list[int], rounds: int) -> None:
    weight = model.get_output_embeddings().weight.detach()
    transposed = weight.t().contiguous()
    packed = torch.ops.mkldnn._reorder_linear_weight(weight, PACK_ROWS_HINT)
    ways: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
        "as stored (F.linear)": lambda x: F.linear(x, weight),
        "transposed (x @ Wt)": lambda x: x @ transposed,
        "oneDNN-packed": lambda x: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""),
    }
    kernel = row_kernel()
    if kernel is not None:
        panels = kernel.pack(weight)
        ways["row kernel"] = lambda x: kernel.linear(x, panels)
    inputs = {w: torch.randn(w, weight.shape[1]) for w in widths}
    samples: dict[tuple[str, int], list[float]] = {(name, w): [] for name in ways for w in widths}
    with torch.inference_mode():
        for _ in range(rounds):
            for name, way in ways.items():
                for w in widths:
                    begin = time.perf_counter()
                    way(inputs[w])
                    samples[name, w].append(1000.0 * (time.perf_counter() - begin))
    print(f"\nLM head alone ({weight.shape[0]}x{weight.shape[1]}), median ms")
    for name in ways:
        print(f"{name:<22}" + " ".join(f"w{w}:{statistics.median(samples[name, w]):>6.2f}" for w in widths))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="YAML config (default: the embedded default)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--widths", default="1,2,3,4,6,8,12,16")
    parser.add_argument("--prompt-tokens", type=int, default=170, help="tokens of context before the timed calls")
    parser.add_argument("--compile", action="store_true", help="also time the torch.compile'd compact forward")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    widths = [int(w) for w in args.widths.split(",")]
    pipeline = load_pipeline(load_config(args.config))
    prompt = pipeline.encode(" ".join(p.text for p in load_prompts(DEFAULT_PROMPTS)))[: args.prompt_tokens]
    model = pipeline.target.model
    timers = {name: WidthTimer(backend, widths) for name, backend in paths(model, 2048, args.compile).items()}
    for timer in timers.values():
        timer.round(prompt)  # warm-up, not counted (and the compile, with --compile)
    timers = {name: WidthTimer(timer.target, widths) for name, timer in timers.items()}
    names = list(timers)
    for turn in range(args.rounds):
        for name in names[turn % len(names) :] + names[: turn % len(names)]:
            timers[name].round(prompt)
    costs = {name: timer.cost() for name, timer in timers.items()}
    print(
        f"per-width cost of one target call after a {prompt.shape[0]}-token prompt, median of {args.rounds} "
        f"rounds, {torch.get_num_threads()} thread(s)"
    )
    curve_table(
        {name: cost.ms for name, cost in costs.items()}, {name: cost.mean_prefill_ms for name, cost in costs.items()}
    )
    lm_head_table(model, [1, 8], args.rounds)


if __name__ == "__main__":
    main()
