"""Execute the walkthrough notebook top to bottom and save a copy with its outputs.

    .venv/bin/python notebooks/render.py            # -> notebooks/walkthrough.executed.ipynb
    .venv/bin/python notebooks/render.py --html     # and walkthrough.executed.html (needs nbconvert)
    .venv/bin/python notebooks/render.py --threads 1  # steadier timings on a machine shared with other jobs

The committed notebook stays without outputs; the executed copies are git-ignored. The kernel is the
Python running this script (so run it with the venv's Python), started in the repository root.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from neuron_ssp.config import EMBEDDED_DEFAULT
from neuron_ssp.embedded.models import resolve_model_path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
NOTEBOOK = HERE / "walkthrough.ipynb"
EXECUTED = HERE / "walkthrough.executed.ipynb"


def execute(path: Path = NOTEBOOK, timeout: int = 600) -> nbformat.NotebookNode:
    """Run every cell in a fresh `python3` kernel; raises CellExecutionError at the first failing cell."""
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}).execute()
    return nb


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--html", action="store_true", help="also write walkthrough.executed.html (nbconvert)")
    parser.add_argument("--timeout", type=int, default=600, help="seconds allowed per cell (default 600)")
    parser.add_argument(
        "--threads",
        type=int,
        help="torch CPU threads in the kernel (default: torch's choice); "
        "on a shared machine 1 avoids threads spinning against other jobs",
    )
    args = parser.parse_args()
    if args.threads:
        os.environ["OMP_NUM_THREADS"] = str(args.threads)  # read by torch when the kernel imports it
    if args.html:
        try:
            from nbconvert import HTMLExporter
        except ImportError:
            print("--html needs nbconvert: pip install nbconvert", file=sys.stderr)
            return 2

    start = time.perf_counter()
    # convert the embedded model here if this machine has not yet (~15 s, once): its progress bars stay
    # out of the rendered notebook, and the kernel inherits NEURON_SSP_CACHE so it finds the result
    resolve_model_path(EMBEDDED_DEFAULT, "target.path")
    nb = execute(timeout=args.timeout)
    nbformat.write(nb, EXECUTED)
    print(f"executed in {time.perf_counter() - start:.0f} s -> {EXECUTED.relative_to(ROOT)}")
    if args.html:
        html, _ = HTMLExporter().from_notebook_node(nb)
        target = EXECUTED.with_suffix(".html")
        target.write_text(html, encoding="utf-8")
        print(f"-> {target.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
