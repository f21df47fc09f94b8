"""Notebooks: reports and plans display as HTML through IPython's formatters (the models
import no renderer), and notebooks/preflight.ipynb runs top to bottom: a failing check, then a
passing one."""

import os
import subprocess
import sys

import nbformat
import pytest
from IPython.core.formatters import DisplayFormatter
from nbclient import NotebookClient

import memcalc
from memcalc.notebook import register_html_formatters
from memcalc.render.html import plan_html, report_html

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MACHINE = {"cpus": 8, "ram_bytes": 64 << 30}
MLP_ARGS = {"in_features": 64, "hidden": 256, "depth": 2}


def _text(output) -> str:
    return output.get("text", "") + str(output.get("data", {}).get("text/html", ""))


def test_reports_and_plans_display_as_html_tables():
    formatter = DisplayFormatter()
    assert register_html_formatters(formatter)
    plan = memcalc.plan("mlp", (64,), gpu="T4", model_args=MLP_ARGS, machine=MACHINE)
    plan_shown = formatter.format(plan)[0]["text/html"]
    assert plan.recommended and f"recommended: {plan.recommended}" in plan_shown
    assert plan_shown == plan_html(plan)
    report = memcalc.estimate("mlp", (64,), batch_size=2, gpu="T4", model_args=MLP_ARGS,
                              machine=MACHINE)
    shown = formatter.format(report)[0]["text/html"]
    for needle in ("activations", "optimizer_state", "fits", "largest batch", "host:"):
        assert needle in shown
    assert shown == report_html(report)


def test_importing_memcalc_outside_ipython_imports_no_renderer():
    code = ("import sys, memcalc; loaded = [m for m in ('IPython', 'torch', 'memcalc.render.html')"
            " if m in sys.modules]; assert not loaded, loaded")
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                               timeout=60, env={**os.environ, "PYTHONPATH": ROOT})
    assert completed.returncode == 0, completed.stderr


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
