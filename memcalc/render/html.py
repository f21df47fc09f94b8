"""HTML for notebooks: the breakdown table and the recommendation (``memcalc.notebook``
registers these with IPython)."""

from __future__ import annotations

from html import escape

from rich.text import Text

from memcalc.render.feed import busy_text
from memcalc.render.validation import validation_lines
from memcalc.render.verdict import verdict_line
from memcalc.report.models import Report
from memcalc.strategies.report import StrategyPlan
from memcalc.units import counted, format_bytes

_STYLE = "border-collapse:collapse;font-family:monospace;font-size:12px"


def _table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th style='text-align:left;padding:2px 8px'>{escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td style='padding:2px 8px'>{escape(c)}</td>" for c in row)
                   + "</tr>" for row in rows)
    return f"<table style='{_STYLE}'><tr>{head}</tr>{body}</table>"


def report_html(report: Report) -> str:
    """The peak, the breakdown table, the largest batch, feeding and host RAM as HTML."""
    device = report.device
    traced = device.method == "traced"
    fits = (" — <b style='color:green'>fits</b>" if device.fits else
            " — <b style='color:red'>does not fit</b>" if device.fits is False else
            "" if traced or device.capacity_bytes is None else
            " — <b style='color:orange'>fit unknown</b>")
    method = "traced" if traced else "<b style='color:orange'>STATIC ESTIMATE, not traced</b>"
    parts = [f"<p><b>{escape(verdict_line(report))}</b></p>",
             f"<h4>memcalc: {escape(report.model.name)}, batch {device.batch_size}, "
             f"{escape(report.spec.precision.value)} — peak {format_bytes(device.peak_bytes)}"
             f" ({method}){fits}</h4>"]
    rows = [[category.value, format_bytes(nbytes), f"{nbytes:,}"]
            for category, nbytes in device.breakdown.by_category().items()]
    if device.peak_reserved_bytes is not None:
        rows.append(["+ allocator reserve", format_bytes(device.peak_reserved_bytes
                                                         - device.breakdown.total_bytes), ""])
        rows.append(["+ CUDA context", format_bytes(device.context_bytes or 0), ""])
    rows.append(["total (nvidia-smi)" if device.kind == "cuda" else "total",
                 format_bytes(device.total_bytes), f"{device.total_bytes:,}"])
    parts.append(_table(["category", "size", "bytes"], rows))
    if device.plan is not None:
        parts.append(f"<p>largest batch on {format_bytes(device.plan.usable_bytes)} usable: "
                     f"<b>{device.plan.max_batch_size}</b></p>")
    if report.throughput is not None:
        t = report.throughput
        parts.append(f"<p>feeding: <b>{escape(t.bound)}-bound</b>, GPU busy "
                     f"{escape(busy_text(t))} with {counted(t.num_workers, 'worker')}</p>")
    lines = validation_lines(report)
    if lines:
        parts.append("<p><b>validation</b>: " + "<br>".join(
            escape(Text.from_markup(line).plain) for line in lines) + "</p>")
    if report.host is not None:
        h = report.host
        parts.append(f"<p>host: {counted(h.max_num_workers, 'worker')} fit, recommended "
                     f"{h.recommended_num_workers}, peak {format_bytes(h.peak_bytes)} of "
                     f"{format_bytes(h.usable_bytes)}</p>")
    return "".join(parts)


def plan_html(plan: StrategyPlan) -> str:
    """The recommendation, its reason and the candidates that fit (or use one GPU) as HTML."""
    rows = [[c.label, str(c.gpus), format_bytes(c.per_gpu_peak_bytes), str(c.max_batch_size),
             f"{c.samples_per_s:,.2f}", "yes" if c.fits else "no"]
            for c in plan.candidates if c.fits or c.gpus == 1]
    return (f"<h4>recommended: {escape(plan.recommended or 'none')}</h4><p>{escape(plan.reason)}"
            "</p>" + _table(["strategy", "GPUs", "per-GPU peak", "batch/GPU", "samples/s",
                             "fits"], rows))
