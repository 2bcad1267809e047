"""The walkthrough notebook: committed without outputs, and runs top to bottom on the CPU default."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from neuron_ssp.config import EMBEDDED_DEFAULT
from neuron_ssp.embedded.models import resolve_model_path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "walkthrough.ipynb"


def test_committed_notebook_has_no_outputs() -> None:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    dirty = [
        i
        for i, cell in enumerate(nb.cells)
        if cell.cell_type == "code" and (cell.outputs or cell.execution_count is not None)
    ]
    assert not dirty, (
        f"cells {dirty} of {NOTEBOOK.name} have outputs: commit it stripped "
        "(python notebooks/render.py writes the executed copy elsewhere)"
    )


@pytest.mark.slow
def test_notebook_runs_top_to_bottom(use_embedded_cache: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Any cell that raises fails the test (CellExecutionError names the cell)."""
    # Convert in this process (once per session, shared with the other slow tests). The kernel inherits
    # os.environ, so NEURON_SSP_CACHE points it at the converted model.
    resolve_model_path(EMBEDDED_DEFAULT, "target.path")
    # one torch thread in the kernel, as in this process (conftest): on a shared CI machine a second
    # thread spins against other jobs and can make the run several times slower
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}).execute()
    figures = [
        out
        for cell in nb.cells
        if cell.cell_type == "code"
        for out in cell.outputs
        if "image/png" in out.get("data", {})
    ]
    assert figures, "the notebook drew no figure"
