"""PNG of predicted memory against batch size: the fitted line, traced points, capacity."""

from __future__ import annotations

from pathlib import Path

from memcalc.errors import InputError
from memcalc.report import Report

GIB = 1 << 30
NEEDS_CAPACITY = "--plot needs a capacity to plan against: add --gpu NAME or --gpu-memory SIZE"


def plot_batch_plan(report: Report, path: str | Path) -> Path:
    """Write the batch plan of ``report`` as a PNG; needs a plan (``--gpu``/``--gpu-memory``)."""
    plan = report.device.plan
    if plan is None:
        raise InputError(NEEDS_CAPACITY)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    largest = max([point.batch_size for point in plan.points] + [plan.max_batch_size + 1, 2])
    batches = [0, largest * 1.1]
    figure, axes = plt.subplots(figsize=(7, 4.2), dpi=120)
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
    axes.set_title(f"{report.model.name} on {report.gpu.name if report.gpu else 'GPU'}")
    axes.set_xlim(left=0)
    axes.set_ylim(bottom=0)
    axes.legend(fontsize=8, loc="lower right")
    figure.tight_layout()
    target = Path(path)
    figure.savefig(target)
    plt.close(figure)
    return target
