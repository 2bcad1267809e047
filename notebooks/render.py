"""Execute the walkthrough notebook top to bottom and save a copy with its outputs.

    .venv/bin/python notebooks/render.py            # -> notebooks/walkthrough.executed.ipynb
    .venv/bin/python notebooks/render.py --html     # and walkthrough.executed.html (needs nbconvert)

The committed notebook stays without outputs; the executed copies are git-ignored. The kernel is the
Python running this script (so run it with the venv's Python), started in the repository root.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

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
    args = parser.parse_args()

    start = time.perf_counter()
    nb = execute(timeout=args.timeout)
    nbformat.write(nb, EXECUTED)
    print(f"executed in {time.perf_counter() - start:.0f} s -> {EXECUTED.relative_to(ROOT)}")
    if args.html:
        try:
            from nbconvert import HTMLExporter
        except ImportError:
            print("nbconvert is not installed: pip install nbconvert (skipped the HTML)", file=sys.stderr)
            return 1
        html, _ = HTMLExporter().from_notebook_node(nb)
        target = EXECUTED.with_suffix(".html")
        target.write_text(html, encoding="utf-8")
        print(f"-> {target.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
