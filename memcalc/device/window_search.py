"""The largest ``sw_batch_size`` of a sliding window that fits: traced, doubling from the
job's own (or halving it while it does not fit), then halving the gap between the last that
fits and the first that does not. Every window runs in each trace, so a step's memory grows
with the windows per forward, not with their count: a few whole-volume traces answer it."""

from __future__ import annotations

from collections.abc import Callable

from memcalc.device.report import DeviceReport, WindowPlan, WindowPoint

MAX_WINDOW_TRACES = 12
"""Traces the search may run; past it the largest traced fit is the answer."""


def plan_sw_batch(report_at: Callable[[int], DeviceReport], windows: int, start: int = 1,
                  known: dict[int, DeviceReport] | None = None) -> WindowPlan:
    """The largest ``sw_batch_size`` in 1..``windows`` whose report fits, from ``start`` up
    or down; ``report_at`` traces one at a capacity, ``known`` holds reports already made
    (the job's own)."""
    reports = dict(known or {})

    def fits(size: int) -> bool:
        if size not in reports:
            reports[size] = report_at(size)
        return bool(reports[size].fits)

    low, high = 0, None        # largest size known to fit, smallest known not to
    size = max(1, min(start, windows))
    while len(reports) < MAX_WINDOW_TRACES:
        if fits(size):
            low = size
            if high is not None or size >= windows:
                break
            size = min(size * 2, windows)
        else:
            high = size
            if size == 1 or low:
                break
            size //= 2
    while high is not None and high - low > 1 and len(reports) < MAX_WINDOW_TRACES:
        middle = (low + high) // 2
        if fits(middle):
            low = middle
        else:
            high = middle
    points = [WindowPoint(sw_batch_size=size, total_bytes=report.total_bytes,
                          fits=bool(report.fits))
              for size, report in sorted(reports.items())]
    return WindowPlan(max_sw_batch_size=low, windows=windows, points=points)
