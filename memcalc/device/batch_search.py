"""The batch-size planner: the largest batch whose predicted total fits the usable memory.

Pure search over a function ``total_at(batch) -> bytes`` (one traced step per call). Two
traces fit ``total(b) = model_bytes + b * per_sample_bytes``; the solved batch is then
confirmed by tracing it and the next one up, and the search walks (secant steps, then
bisection) until a traced batch fits and the next one does not.
"""

from __future__ import annotations

from collections.abc import Callable

from pydantic import BaseModel, ConfigDict

FIT_BATCHES = (1, 8)
MAX_TRACES = 20
GROWTH = 8   # batch multiplier while the totals are still flat (no ceiling found yet)
MAX_BATCH = 1 << 24


class PlanPoint(BaseModel):
    """One traced batch size and its predicted total."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    batch_size: int
    total_bytes: int
    fits: bool
    allocated_bytes: int | None = None
    """Live tensor bytes + workspaces at the peak (what the allocator reserves for)."""
    compute_peak_bytes: int | None = None
    """Live tensor bytes at the forward/backward peak; the strategy planner's rising line."""
    optimizer_peak_bytes: int | None = None
    """Live tensor bytes at the optimizer-step peak; the flat line."""


class BatchPlan(BaseModel):
    """The fitted linear model and the confirmed largest batch (0 when batch 1 does not fit)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    usable_bytes: int
    model_bytes: int
    per_sample_bytes: int
    fit_batches: tuple[int, int]
    """The traced batches the line goes through: 1 and 8, or 1 and the planned batch."""
    max_batch_size: int
    confirmed: bool
    """True when the planned batch fits and the next one up does not, both traced."""
    points: list[PlanPoint]


def plan_batch(total_at: Callable[[int], int], usable_bytes: int,
               fits_at: Callable[[int], bool | None] | None = None) -> BatchPlan:
    """Find the largest batch that fits: ``fits_at(batch)`` when given (the allocator
    replayed with the usable bytes as its limit), else ``total_at(batch) <= usable_bytes``.
    Totals steer the search either way."""
    totals: dict[int, int] = {}
    fitting: dict[int, bool] = {}

    def measure(batch: int) -> int:
        if batch not in totals:
            totals[batch] = total_at(batch)
            verdict = fits_at(batch) if fits_at else None
            fitting[batch] = totals[batch] <= usable_bytes if verdict is None else verdict
        return totals[batch]

    small, large = FIT_BATCHES
    measure(large)
    measure(small)
    if not fitting[small]:
        return _plan(usable_bytes, (small, large), 0, True, totals, fitting)
    best = _search(measure, totals, fitting, usable_bytes)
    confirmed = best + 1 in totals and not fitting[best + 1]
    # Near the answer the allocator rounds every large tensor to its own segment, so the
    # line through batch 1 and the planned batch describes the operating range best.
    return _plan(usable_bytes, (small, max(large, best)), best, confirmed, totals, fitting)


def _search(measure: Callable[[int], int], totals: dict[int, int], fitting: dict[int, bool],
            usable_bytes: int) -> int:
    """Largest traced batch that fits, tracing until the next one up is known not to.

    Secant steps through the bracket's ends; after two steps that land on the same side,
    one bisection step, so a curved total still converges (Illinois-style safeguard).
    """
    sides: list[bool] = []
    for _ in range(MAX_TRACES):
        over = [batch for batch in totals if not fitting[batch]]
        ceiling = min(over) if over else None
        best = max(batch for batch in totals if fitting[batch]
                   and (ceiling is None or batch < ceiling))
        if ceiling == best + 1 or best >= MAX_BATCH:
            return best
        bisect = len(sides) >= 2 and sides[-1] == sides[-2]
        candidate = _next_candidate(totals, best, ceiling, usable_bytes, bisect)
        measure(candidate)
        sides.append(fitting[candidate])
    over = [batch for batch in totals if not fitting[batch]]
    return max(batch for batch in totals if fitting[batch] and (not over or batch < min(over)))


def _next_candidate(totals: dict[int, int], fitting: int, ceiling: int | None,
                    usable_bytes: int, bisect: bool) -> int:
    """Secant through the bracket's ends (or its midpoint), strictly inside the bracket."""
    if ceiling is None:
        others = [batch for batch in totals if batch < fitting]
        previous = max(others) if others else fitting
        slope = ((totals[fitting] - totals[previous]) / (fitting - previous)
                 if previous != fitting else 0.0)
        if bisect or slope <= 0:
            return min(fitting * GROWTH, MAX_BATCH)
        guess = fitting + int((usable_bytes - totals[fitting]) // slope)
        return max(fitting + 1, min(guess, MAX_BATCH))
    if bisect:
        return (fitting + ceiling) // 2
    slope = (totals[ceiling] - totals[fitting]) / (ceiling - fitting)
    guess = fitting + int((usable_bytes - totals[fitting]) // slope) if slope > 0 else fitting + 1
    return max(fitting + 1, min(guess, ceiling - 1))


def _plan(usable_bytes, fit_batches, best, confirmed, totals, fitting) -> BatchPlan:
    batch_a, batch_b = fit_batches
    per_sample = max(0, round((totals[batch_b] - totals[batch_a]) / (batch_b - batch_a)))
    points = [PlanPoint(batch_size=batch, total_bytes=total, fits=fitting[batch])
              for batch, total in sorted(totals.items())]
    return BatchPlan(usable_bytes=usable_bytes, model_bytes=totals[batch_a] - batch_a * per_sample,
                     per_sample_bytes=per_sample, fit_batches=fit_batches, max_batch_size=best,
                     confirmed=confirmed, points=points)
