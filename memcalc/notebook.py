"""Reports and plans shown as HTML tables in Jupyter and IPython.

The report models know nothing of rendering; this top-layer module hands IPython the HTML
renderers of ``memcalc.render.html``. ``import memcalc`` calls ``register_html_formatters()``,
which registers by type name, so nothing heavier than this module is imported until a report
is displayed (``python -m memcalc.host.probe`` must pay for torch only).
"""

from __future__ import annotations

import sys
from typing import Any

# (module, class) of each displayed model → its renderer in memcalc.render.html.
HTML_RENDERERS = {
    ("memcalc.report.models", "Report"): "report_html",
    ("memcalc.strategies.report", "StrategyPlan"): "plan_html",
}


def register_html_formatters(formatter: Any = None) -> bool:
    """Display reports and plans as HTML in ``formatter`` (an IPython ``DisplayFormatter``),
    by default the running IPython shell's; False when no shell is running."""
    if formatter is None:
        # Only a shell that is already running counts: IPython is never imported here.
        ipython = sys.modules.get("IPython")
        shell = ipython.get_ipython() if ipython is not None else None
        if shell is None:
            return False
        formatter = shell.display_formatter
    html = formatter.formatters["text/html"]
    for (module, name), renderer in HTML_RENDERERS.items():
        html.for_type_by_name(module, name, _lazy_renderer(renderer))
    return True


def _lazy_renderer(name: str):
    """The HTML renderer ``name``, imported when the first report is displayed."""
    def render(value: Any) -> str:
        from memcalc.process_defaults import random_states_kept

        with random_states_kept():      # rich draws from Python's when first imported
            from memcalc.render import html

            return getattr(html, name)(value)

    render.__name__ = name
    return render
