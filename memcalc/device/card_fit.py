"""Without ``--gpu``: the largest batch on a short list of common cards, one per memory class.

Pure search over ``report_at(card, batch) -> DeviceReport``, where each batch is traced once
and replayed through the allocator for each card (cheap: milliseconds). Each card's line
through batches 1 and 8 gives its batch; where a small error of the line would change the
answer (the line's total at that batch, or at the next, within ``NEAR_FRACTION`` of the usable
memory) and the batch is small enough for one sample to matter, the card's batch search
(``plan_batch``) confirms it by tracing, within a budget of traces shared by all cards.

Batches on a checked line of the traces (``memcalc.trace.step_line``) cost no trace: once a
third trace has checked it, every card is searched in full.

Known limitations: the trace is made for no card in particular (attention kernels as on a
recent card); each card's CUDA context, workspaces and allocator limit are its own.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from memcalc.device.batch_search import FIT_BATCHES, MAX_BATCH, plan_batch
from memcalc.device.report import CardFit, DeviceReport

COMMON_CARDS = ("RTX-4090", "A100-40GB", "L40S", "H100-80GB", "H200")
"""One card per memory class users rent or own: 24, 40, 48, 80 and 141 GB."""
NEAR_FRACTION = 0.02
"""The line's answer is confirmed by tracing where an error this large would change it."""
CONFIRM_MAX_BATCH = 1024
"""Above this batch one sample more or less is not worth a trace: the line's answer stands."""
CONFIRM_TRACES = 5
"""New batches traced for confirmation, all cards together, beyond the line's two (each
costs as much as the step's own trace; a card's search starts from every batch traced for
the cards before it). Five confirm the smallest card, the head's first figure, in most
searches, and keep an estimate of a zoo model near 5 s beyond ``import torch``; the other
cards' batches stand on the traced lines, marked ``~``."""
MIN_TO_CONFIRM = 3
"""A search confirms a batch by tracing it and the next one up, after a guess at least: a
card is not searched with fewer traces left (they would be spent and confirm nothing)."""


ReportAt = Callable[[str, int], DeviceReport]


class _OutOfBudget(Exception):
    """A confirmation would trace one batch more than the budget allows."""


def card_fits(report_at: ReportAt, usable_bytes: dict[str, int], memory_bytes: dict[str, int],
              traced: Callable[[], set[int]], budget: int = CONFIRM_TRACES,
              costs_no_trace: Callable[[int], bool] | None = None) -> list[CardFit]:
    """The largest batch on each card in ``usable_bytes`` (card name → usable bytes).
    ``traced()`` is the set of batches traced so far: their reports cost no trace, nor do
    those ``costs_no_trace`` says need none (on a checked line of the traces), and new ones
    stay within ``budget`` (all cards together)."""
    small, large = FIT_BATCHES
    spent = [0]
    free = costs_no_trace or (lambda batch: batch in traced())

    def within_budget(card: str) -> Callable[[int], DeviceReport]:
        def at(batch: int) -> DeviceReport:
            if not free(batch):
                if spent[0] >= budget:
                    raise _OutOfBudget
                spent[0] += 1
            return report_at(card, batch)
        return at

    fits = []
    for card, usable in usable_bytes.items():
        def fit(batch: int, total: int, confirmed: bool) -> CardFit:
            upper = None if confirmed else max(batch, _allocated_bound(first, second, usable))
            return CardFit(gpu=card, memory_bytes=memory_bytes[card], usable_bytes=usable,
                           max_batch_size=batch, total_bytes=total, confirmed=confirmed,
                           upper_batch_size=upper)

        first = report_at(card, small)
        if not _fits(first, usable):
            fits.append(fit(0, first.total_bytes, True))
            continue
        second = report_at(card, large)
        flat = second.total_bytes <= first.total_bytes     # no slope yet: only a search says
        if not flat and _from_line(first.total_bytes, second.total_bytes,
                                   usable)[0] > CONFIRM_MAX_BATCH:
            fits.append(fit(*_from_line(first.total_bytes, second.total_bytes, usable), False))
            continue
        try:
            plan = plan_batch(within_budget(card), usable, known=traced())[0]
        except _OutOfBudget:
            fits.append(fit(*_between_traced(
                {batch: report_at(card, batch) for batch in traced()}, usable), False))
            continue
        finally:
            if budget - spent[0] < MIN_TO_CONFIRM:  # too few left to confirm another card
                spent[0] = budget
        total = next(p.total_bytes for p in plan.points if p.batch_size == plan.max_batch_size)
        fits.append(fit(plan.max_batch_size, total, plan.confirmed))
    return fits


def _between_traced(reports: dict[int, DeviceReport], usable: int) -> tuple[int, int]:
    """The batch where the line through the traced batches around the answer meets
    ``usable``: between the largest that fits and the next that does not, or beyond the two
    largest that fit."""
    fitting = sorted(b for b, r in reports.items() if _fits(r, usable))
    over = [b for b, r in reports.items() if not _fits(r, usable) and b > fitting[0]]
    low = max(b for b in fitting if not over or b < min(over))
    high = min(over) if over else None
    below = [b for b in fitting if b < low]
    if high is None and not below:
        return low, reports[low].total_bytes
    # beyond the largest that fits, the line from the smallest: two close batches can share
    # one total (the allocator's segments), a flat line that would stop at the last one
    a, b = (low, high) if high is not None else (min(below), low)
    slope = (reports[b].total_bytes - reports[a].total_bytes) / (b - a)
    if slope <= 0:
        return low, reports[low].total_bytes
    batch = a + math.floor((usable - reports[a].total_bytes) / slope)
    batch = max(low, min(batch, high - 1 if high is not None else MAX_BATCH))
    return batch, round(reports[a].total_bytes + (batch - a) * slope)


def _allocated_bound(first: DeviceReport, second: DeviceReport, usable: int) -> int:
    """Where the line of allocated bytes (+ the context) through batches 1 and 8 meets
    ``usable``: no batch above it can fit, whatever the allocator caches."""
    low, high = (report.peak_allocated_bytes + (report.context_bytes or 0)
                 for report in (first, second))
    if high <= low:
        return MAX_BATCH
    return _from_line(low, high, usable)[0]


def _fits(report: DeviceReport, usable: int) -> bool:
    return report.fits if report.fits is not None else report.total_bytes <= usable


def _line(total_small: int, total_large: int) -> tuple[float, float]:
    small, large = FIT_BATCHES
    slope = (total_large - total_small) / (large - small)
    return total_small - small * slope, slope


def _from_line(total_small: int, total_large: int, usable: int) -> tuple[int, int]:
    """The line's largest batch within ``usable`` and its total there (a rising line)."""
    intercept, slope = _line(total_small, total_large)
    batch = max(1, min(MAX_BATCH, math.floor((usable - intercept) / slope)))
    return batch, round(intercept + batch * slope)
