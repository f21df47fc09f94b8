"""Pictures of a report (matplotlib, PNG): the breakdown at the peak, memory against batch
size with the capacity (only when there is a capacity: no empty panel), live memory over the
traced step with its phases, and the modules whose own activations are alive at the peak.
Each axis is in the IEC unit its largest value reads best in."""

from __future__ import annotations

import contextlib

import os
from pathlib import Path

from memcalc.errors import InputError
from memcalc.report.models import Report
from memcalc.units import format_bytes

UNITS = (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10), ("B", 1))
PHASE_COLORS = {"forward": "#dbeafe", "backward": "#fde68a", "optimizer": "#d1fae5",
                "zero_grad": "#e5e7eb", "setup": "#ffffff"}


PLOT_SUFFIXES = (".png", ".pdf", ".svg")


def check_plot_path(path: str | Path) -> Path:
    """The plot's path made absolute (the user's code may change the working directory),
    refused before any work when it cannot be written: an unsupported suffix, a missing or
    read-only directory."""
    target = Path(path)
    if target.suffix.lower() not in PLOT_SUFFIXES:
        raise InputError(f"--plot {str(path)!r}: name a .png, .pdf or .svg file")
    folder = target.parent if str(target.parent) else Path(".")
    if folder.exists() and not folder.is_dir():
        raise InputError(f"--plot {str(path)!r}: {str(folder)!r} is a file, not a folder")
    if not folder.is_dir():
        raise InputError(f"--plot {str(path)!r}: folder {str(folder)!r} does not exist; "
                         "create it first")
    if not os.access(folder, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise InputError(f"--plot {str(path)!r}: not writable here; choose another path")
    return target.absolute()


def unit_for(largest_bytes: float) -> tuple[str, int]:
    """The IEC unit in which ``largest_bytes`` reads as at least 1."""
    return next(((name, size) for name, size in UNITS if largest_bytes >= size), UNITS[-1])


def plot_report(report: Report, path: str | Path | None = None):
    """The pictures side by side (2×2 with a capacity, else three in a row); written to
    ``path`` when given (``memcalc.plot``, ``memcalc estimate --plot``)."""
    with _font_files_closed():
        return _plot_report(report, path)


@contextlib.contextmanager
def _font_files_closed():
    """matplotlib keeps the font files it opened for the process (a cache): closed again
    when this call was the one to open them, so no file stays open in the caller."""
    from matplotlib import font_manager

    cached = font_manager._get_font.cache_info().currsize
    try:
        yield
    finally:
        if cached == 0:
            font_manager._get_font.cache_clear()


def _plot_report(report: Report, path: str | Path | None):
    panels = [plot_breakdown, plot_batch, plot_timeline, plot_top_modules]
    if report.device.plan is None:
        panels.remove(plot_batch)
    rows, columns = (2, 2) if len(panels) == 4 else (1, 3)
    size = (12, 8) if rows == 2 else (16, 5)
    if path is None:                 # shown where the caller works (a notebook's backend)
        import matplotlib.pyplot as plt
        figure, axes = plt.subplots(rows, columns, figsize=size, dpi=110, squeeze=False)
    else:                            # written: a figure of its own, the backend untouched
        from matplotlib.figure import Figure
        figure = Figure(figsize=size, dpi=110)
        axes = figure.subplots(rows, columns, squeeze=False)
    for draw, panel in zip(panels, axes.flat):
        draw(panel, report)
    figure.suptitle(f"{report.model.name}, batch {report.device.batch_size}, "
                    f"{report.spec.precision.value}"
                    + (f", {report.gpu.name}" if report.gpu else ""))
    figure.tight_layout()
    if path is not None:
        try:
            figure.savefig(Path(path))
        except OSError as error:   # a disk that filled up, a folder removed meanwhile
            raise InputError(f"--plot {str(path)!r} could not be written: {error.strerror or error}"
                             ) from error
    return figure


def plot_breakdown(axes, report: Report) -> None:
    """One stacked bar of the bytes at the peak by category, with the capacity line; the
    legend names only the categories that hold bytes."""
    device, left = report.device, 0.0
    parts = [(category.value, nbytes) for category, nbytes in device.breakdown.by_category().items()]
    if device.peak_reserved_bytes is not None:
        parts.append(("allocator reserve", device.peak_reserved_bytes - device.breakdown.total_bytes))
        parts.append(("CUDA context", device.context_bytes or 0))
    unit, size = unit_for(max(sum(n for _, n in parts if n > 0), device.capacity_bytes or 0))
    for label, nbytes in parts:
        if nbytes > 0:
            axes.barh([0], [nbytes / size], left=left, label=f"{label} {format_bytes(nbytes)}")
            left += nbytes / size
    if device.capacity_bytes:
        axes.axvline(device.capacity_bytes / size, color="black",
                     label=f"capacity {format_bytes(device.capacity_bytes)}")
    axes.set_yticks([])
    axes.set_xlabel(f"{unit} at the peak")
    axes.set_title("Breakdown at the peak")
    axes.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=3)


AXIS_REACH = 1.5
"""The batch axis reaches this far past the largest batch (or the job's batch)."""


def plot_batch(axes, report: Report) -> None:
    """The fitted line of total memory against batch size, the traced batches and capacity
    (drawn only for a report with a batch plan)."""
    plan = report.device.plan
    axes.set_title("Memory against batch size")
    # the axis spans the answer (the largest batch, the job's), not an exploratory trace
    # far past it: those are left out and counted in the legend
    reach = max(plan.max_batch_size + 1, report.device.batch_size or 0, 2) * AXIS_REACH
    shown = [point for point in plan.points if point.batch_size <= reach]
    largest = max([point.batch_size for point in shown] + [plan.max_batch_size + 1, 2])
    batches = [0, largest * 1.1]
    line = [plan.model_bytes + b * plan.per_sample_bytes for b in batches]
    capacity = report.device.capacity_bytes
    unit, size = unit_for(max(line + [p.total_bytes for p in shown] + [capacity]))
    axes.plot(batches, [total / size for total in line], label="model + batch x per sample",
              color="tab:blue")
    beyond = len(plan.points) - len(shown)
    if beyond:
        axes.plot([], [], " ", label=f"{beyond} traced beyond batch {int(reach)}, not shown")
    for fits in (True, False):
        points = [point for point in shown if point.fits is fits]
        if points:
            axes.scatter([point.batch_size for point in points],
                         [point.total_bytes / size for point in points],
                         color="tab:green" if fits else "tab:red", zorder=3,
                         label="traced, fits" if fits else "traced, over")
    axes.axhline(capacity / size, color="black", label=f"capacity {format_bytes(capacity)}")
    axes.axhline(plan.usable_bytes / size, color="black", linestyle="--",
                 label="usable (capacity - headroom - driver reserve)")
    if plan.max_batch_size:
        axes.axvline(plan.max_batch_size, color="tab:green", linestyle=":",
                     label=f"largest batch {plan.max_batch_size}")
    axes.set_xlabel("batch size")
    axes.set_ylabel(f"predicted total (nvidia-smi), {unit}")
    axes.set_xlim(left=0)
    axes.set_ylim(bottom=0)
    axes.legend(fontsize=7, loc="lower right")


def plot_timeline(axes, report: Report) -> None:
    """Live tensor bytes over the traced iterations, the phases shaded."""
    timeline = report.device.timeline
    axes.set_title("Live tensor memory over the traced step")
    if not timeline:
        axes.text(0.5, 0.5, "no trace (static estimate)", ha="center", va="center",
                  transform=axes.transAxes)
        return
    start = 0
    for index, point in enumerate(timeline + [None]):
        if point is None or point.phase != timeline[start].phase or (
                point.iteration != timeline[start].iteration):
            end = timeline[index - 1].event
            axes.axvspan(timeline[start].event, end, color=PHASE_COLORS.get(timeline[start].phase,
                                                                            "#ffffff"), lw=0)
            start = index
    unit, size = unit_for(max(p.live_bytes for p in timeline))
    axes.plot([p.event for p in timeline], [p.live_bytes / size for p in timeline],
              color="tab:blue")
    for phase, color in PHASE_COLORS.items():
        if any(p.phase == phase for p in timeline) and phase != "setup":
            axes.fill_between([], [], color=color, label=phase)
    axes.set_xlabel("allocation events (two iterations)")
    axes.set_ylabel(f"live {unit}")
    axes.legend(fontsize=7, loc="upper left")


def plot_top_modules(axes, report: Report) -> None:
    """The ten modules whose own activations (each tensor once, in the innermost module that
    made it) hold the most bytes at the peak."""
    modules = list(reversed(report.device.top_modules[:10]))
    axes.set_title("Own activations at the peak, by module")
    if not modules:
        axes.text(0.5, 0.5, "no activations at the peak", ha="center", va="center",
                  transform=axes.transAxes)
        return
    unit, size = unit_for(max(m.activation_bytes for m in modules))
    axes.barh([m.module or "(model)" for m in modules], [m.activation_bytes / size for m in modules],
              color="tab:orange")
    axes.set_xlabel(unit)
    axes.tick_params(axis="y", labelsize=7)
