"""notebooks/preflight.ipynb runs top to bottom: a failing check, then a passing one."""

import os

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _text(output) -> str:
    return output.get("text", "") + str(output.get("data", {}).get("text/html", ""))


@pytest.mark.slow
def test_preflight_notebook_fails_then_passes():
    notebook = nbformat.read(os.path.join(ROOT, "notebooks", "preflight.ipynb"), as_version=4)
    NotebookClient(notebook, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": os.path.join(ROOT, "notebooks")}}).execute()
    outputs = [[o for o in cell.outputs] for cell in notebook.cells if cell.cell_type == "code"]
    failing = " ".join(_text(o) for o in outputs[1])
    assert "does not fit: batch 8 needs" in failing and "cheapest fixes" in failing
    passing = " ".join(_text(o) for o in outputs[2])
    assert "fits</b>" in passing and "fp16-mixed" in passing
    assert any("image/png" in o.get("data", {}) for o in outputs[3])
    assert "batch 8 fits" in _text(outputs[4][0])
