"""How long validating a config takes: it runs on every CLI call, so it must stay under 50 ms.

Prints, per shipped config, the median and worst time of validate_config alone and of
load_config + validate_config (YAML parse and schema included), over many repetitions.

    python benchmarks/validate_speed.py [--repeat N]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from neuron_ssp.config import load_config
from neuron_ssp.topology import plan_deployment, validate_config

BUDGET_MS = 50.0
CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def timings_ms(action: Callable[[], object], repeat: int) -> list[float]:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        action()
        samples.append((time.perf_counter() - start) * 1000)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()

    worst = 0.0
    print(f"{'config':<34} {'validate median/max ms':>24} {'load+validate median/max ms':>30}")
    for path in sorted(CONFIGS.glob("*.yaml")):
        config = load_config(path)
        alone = timings_ms(lambda config=config: validate_config(config), args.repeat)
        loaded = timings_ms(lambda path=path: validate_config(load_config(path)), args.repeat)
        if config.platform.backend == "neuron":
            plan_deployment(config)  # planning must not fail on a shipped config either
        worst = max(worst, max(loaded))
        print(
            f"{path.name:<34} {statistics.median(alone):>11.3f} / {max(alone):<10.3f}"
            f" {statistics.median(loaded):>14.3f} / {max(loaded):<10.3f}"
        )
    verdict = "within" if worst < BUDGET_MS else "OVER"
    print(
        f"worst load+validate: {worst:.3f} ms ({verdict} the {BUDGET_MS:.0f} ms budget, {args.repeat} runs per config)"
    )


if __name__ == "__main__":
    main()
