"""memcalc: memory of a PyTorch training step, predicted before launch, without a GPU.

    >>> import memcalc
    >>> report = memcalc.estimate("resnet3d", (834, 224, 834, 3), batch_size=2)
    >>> report.device.peak_bytes
    >>> memcalc.plot(report, "report.png")    # breakdown, batch, timeline, top modules

Names are imported on first use, so ``python -m memcalc.host.probe`` (which runs inside the
user's data-loading process) pays for torch only. In Jupyter and IPython, reports and plans
display as HTML tables (``memcalc.notebook``).
"""

from __future__ import annotations

import importlib
from typing import Any

from memcalc.notebook import register_html_formatters as _register_html_formatters

_EXPORTS = {
    "estimate": "memcalc.api", "plan": "memcalc.api", "check": "memcalc.api",
    "estimate_spec": "memcalc.pipeline", "StrategyPlan": "memcalc.strategies",
    "TrainingSpec": "memcalc.specs", "Report": "memcalc.report.models",
    "MemcalcError": "memcalc.errors", "InputError": "memcalc.errors",
    "LayoutError": "memcalc.errors", "ModelSourceError": "memcalc.errors",
    "TraceError": "memcalc.errors", "MemoryBudgetError": "memcalc.errors",
    "plot": "memcalc.render.plot",
}
_RENAMED = {"estimate_spec": "estimate", "plot": "plot_report"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'memcalc' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), _RENAMED.get(name, name))
    globals()[name] = value
    return value


_register_html_formatters()
