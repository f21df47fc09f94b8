"""The first line of ``memcalc estimate``: the answer to "does it fit?", with its numbers."""

from __future__ import annotations

from memcalc.device.gpus import gpu_catalog
from memcalc.report.models import Report
from memcalc.units import format_bytes


def verdict_line(report: Report) -> str:
    """FITS / DOES NOT FIT / FIT UNKNOWN (STATIC) with the batch, the bytes and the capacity
    (within 80 columns for the usual sizes); without a GPU, how the step compares with the
    cards in the catalog."""
    device = report.device
    needs = f"batch {device.batch_size} needs {format_bytes(device.total_bytes)}"
    if device.method != "traced":
        return f"FIT UNKNOWN (STATIC): {needs} or more (step not traced)"
    if device.kind != "cuda":
        return f"CPU training: {needs} of host RAM for the step"
    if device.capacity_bytes is None:
        return _against_catalog(needs, device.total_bytes)
    usable = format_bytes(device.capacity_bytes - device.headroom_bytes)
    on = f" on {report.gpu.name}" if report.gpu else ""
    largest = device.max_batch_size
    verdict = "FITS" if device.fits else "DOES NOT FIT"
    if largest:
        return f"{verdict}{on}: {needs} / {usable} usable (max batch {largest})"
    return f"{verdict}{on}: {needs} / {usable} usable" + ("" if device.fits else "; memcalc plan")


def _against_catalog(needs: str, total_bytes: int) -> str:
    biggest = max(gpu_catalog(), key=lambda gpu: gpu.memory_bytes)
    if total_bytes > biggest.memory_bytes:
        return (f"DOES NOT FIT ANY GPU: {needs} ({biggest.name}: "
                f"{format_bytes(biggest.memory_bytes)}); memcalc plan")
    smallest = min((gpu for gpu in gpu_catalog() if gpu.memory_bytes >= total_bytes),
                   key=lambda gpu: gpu.memory_bytes)
    return (f"{needs}; smallest card for it: {smallest.name} "
            f"({format_bytes(smallest.memory_bytes)}); --gpu for a verdict")
