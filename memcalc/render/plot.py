"""Pictures of a report (matplotlib, PNG): the breakdown at the peak, memory against batch
size with the capacity, live memory over the traced step with its phases, and the modules
whose activations are alive at the peak."""

from __future__ import annotations

import os
from pathlib import Path

from memcalc.errors import InputError
from memcalc.report.models import Report

GIB = 1 << 30
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


def plot_report(report: Report, path: str | Path | None = None):
    """A 2×2 figure of the four pictures; written as PNG when ``path`` is given
    (``memcalc.plot``, ``memcalc estimate --plot``)."""
    import matplotlib

    if path is not None:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(2, 2, figsize=(12, 8), dpi=110)
    plot_breakdown(axes[0][0], report)
    plot_batch(axes[0][1], report)
    plot_timeline(axes[1][0], report)
    plot_top_modules(axes[1][1], report)
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
        finally:
            plt.close(figure)
    return figure


def plot_breakdown(axes, report: Report) -> None:
    """One stacked bar of the bytes at the peak by category, with the capacity line."""
    device, left = report.device, 0.0
    parts = [(category.value, nbytes) for category, nbytes in device.breakdown.by_category().items()]
    if device.peak_reserved_bytes is not None:
        parts.append(("allocator reserve", device.peak_reserved_bytes - device.breakdown.total_bytes))
        parts.append(("CUDA context", device.context_bytes or 0))
    for label, nbytes in parts:
        if nbytes > 0:
            axes.barh([0], [nbytes / GIB], left=left, label=f"{label} {nbytes / GIB:.2f} GiB")
            left += nbytes / GIB
    if device.capacity_bytes:
        axes.axvline(device.capacity_bytes / GIB, color="black", label="capacity")
    axes.set_yticks([])
    axes.set_xlabel("GiB at the peak")
    axes.set_title("Breakdown at the peak")
    axes.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=3)


def plot_batch(axes, report: Report) -> None:
    """The fitted line of total memory against batch size, the traced batches and capacity."""
    plan = report.device.plan
    axes.set_title("Memory against batch size")
    if plan is None:
        axes.text(0.5, 0.5, "no capacity given (--gpu / --gpu-memory)", ha="center",
                  va="center", transform=axes.transAxes)
        return
    largest = max([point.batch_size for point in plan.points] + [plan.max_batch_size + 1, 2])
    batches = [0, largest * 1.1]
    axes.plot(batches, [(plan.model_bytes + b * plan.per_sample_bytes) / GIB for b in batches],
              label="model + batch x per sample", color="tab:blue")
    for fits in (True, False):
        points = [point for point in plan.points if point.fits is fits]
        axes.scatter([point.batch_size for point in points],
                     [point.total_bytes / GIB for point in points],
                     color="tab:green" if fits else "tab:red", zorder=3,
                     label="traced, fits" if fits else "traced, over")
    capacity = report.device.capacity_bytes
    axes.axhline(capacity / GIB, color="black", label=f"capacity {capacity / GIB:.1f} GiB")
    axes.axhline(plan.usable_bytes / GIB, color="black", linestyle="--", label="capacity - headroom")
    if plan.max_batch_size:
        axes.axvline(plan.max_batch_size, color="tab:green", linestyle=":",
                     label=f"largest batch {plan.max_batch_size}")
    axes.set_xlabel("batch size")
    axes.set_ylabel("predicted total (nvidia-smi), GiB")
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
    axes.plot([p.event for p in timeline], [p.live_bytes / GIB for p in timeline],
              color="tab:blue")
    for phase, color in PHASE_COLORS.items():
        if any(p.phase == phase for p in timeline) and phase != "setup":
            axes.fill_between([], [], color=color, label=phase)
    axes.set_xlabel("allocation events (two iterations)")
    axes.set_ylabel("live GiB")
    axes.legend(fontsize=7, loc="upper left")


def plot_top_modules(axes, report: Report) -> None:
    """The ten modules whose activations hold the most bytes at the peak."""
    modules = list(reversed(report.device.top_modules[:10]))
    axes.set_title("Activations alive at the peak, by module")
    if not modules:
        axes.text(0.5, 0.5, "no activations at the peak", ha="center", va="center",
                  transform=axes.transAxes)
        return
    axes.barh([m.module for m in modules], [m.activation_bytes / GIB for m in modules],
              color="tab:orange")
    axes.set_xlabel("GiB")
    axes.tick_params(axis="y", labelsize=7)
