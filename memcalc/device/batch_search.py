"""The batch search: the largest batch whose step runs in the usable memory.

Pure search over a function ``report_at(batch) -> DeviceReport`` (one traced step per call;
its ``fits`` decides, its total steers). Two traces fit
``total(b) = model_bytes + b * per_sample_bytes`` (batch 1 and batch 8, or the job's own
batch where it is traced anyway for the report); the solved batch is then confirmed by
tracing it and the next one up, and the search walks (secant steps, then bisection) until a
traced batch fits and the next one does not; above ``EXACT_UP_TO`` samples, until the two
are within a hundredth of the batch (the plan is then not ``confirmed``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from memcalc.device.report import BatchPlan, DeviceReport, PlanPoint
from memcalc.device.search_guesses import (
    MAX_BATCH,
    floor_bytes,
    floor_ceiling,
    floor_secant,
    next_candidate,
    over_secant,
)

FIT_BATCHES = (1, 8)
MAX_TRACES = 20
RELATIVE_RESOLUTION = 100
"""Above ``EXACT_UP_TO`` the search stops once the largest batch is known to 1/this of
itself (a batch that fits and one that does not, that close): one sample more or less is
then not worth a trace."""
EXACT_UP_TO = 1024
"""Up to this batch the answer is exact (confirmed by the next batch up)."""


def plan_batch(report_at: Callable[[int], DeviceReport], usable_bytes: int,
               max_steps: int = MAX_TRACES, known: Iterable[int] = (),
               job_batch: int | None = None) -> tuple[BatchPlan, dict[int, DeviceReport]]:
    """Find the largest batch that fits, and return every report made on the way.

    A batch fits when its report says so (the allocator replayed with the usable bytes as
    its limit), else when its total is within ``usable_bytes``. Totals steer the search,
    which takes at most ``max_steps`` batches beyond the first two (then the plan is the
    largest batch known to fit, not ``confirmed``). ``known``: batches whose reports cost
    nothing (traced already, for another card), measured first so the search starts from
    the bracket they give. ``job_batch``: the batch the caller reports at (traced whatever
    the search does), measured second in place of batch 8 where batch 1 does not say that
    fewer would fit: one trace fewer, the same line."""
    reports: dict[int, DeviceReport] = {}
    totals: dict[int, int] = {}
    fitting: dict[int, bool] = {}
    floors: dict[int, int] = {}   # what the step holds before any allocator reserve

    def measure(batch: int) -> int:
        if batch not in totals:
            reports[batch] = report = report_at(batch)
            totals[batch] = report.total_bytes
            fitting[batch] = _fits(report, usable_bytes)
            floors[batch] = floor_bytes(report)
        return totals[batch]

    small, large = FIT_BATCHES
    measure(small)
    few = _few_fit(reports[small], usable_bytes) if fitting[small] else None
    second = few or large
    if job_batch is not None and job_batch > small and (few is None or job_batch <= few):
        second = job_batch
    for batch in (second, *sorted(set(known) - {small, second})):
        measure(batch)
    if not fitting[small]:
        return _plan(usable_bytes, (small, second), 0, True, reports, fitting), reports
    best = _search(measure, totals, fitting, usable_bytes, max_steps, floors)
    confirmed = best + 1 in totals and not fitting[best + 1]
    # Near the answer the allocator rounds every large tensor to its own segment, so the
    # line through the smallest traced batch and the planned batch describes the operating
    # range best.
    return _plan(usable_bytes, _fit_batches(reports, best), best, confirmed, reports,
                 fitting), reports


def plan_batch_in_steps(report_at: Callable[[int], DeviceReport], usable_bytes: int,
                        step: int, job_batch: int | None = None) -> BatchPlan:
    """``plan_batch`` over batches that are multiples of ``step`` (a pipeline's 1F1B
    schedule needs at least a microbatch per stage): the search runs in steps and its plan
    is given in samples. ``job_batch`` (samples): as ``plan_batch`` takes it, where it is a
    whole number of steps."""
    in_steps = job_batch // step if job_batch and job_batch % step == 0 else None
    plan, _ = plan_batch(lambda steps: report_at(steps * step), usable_bytes,
                         job_batch=in_steps)
    if step == 1:
        return plan
    return _in_samples(plan, step)


def _in_samples(plan: BatchPlan, step: int) -> BatchPlan:
    return plan.model_copy(update={
        "per_sample_bytes": round(plan.per_sample_bytes / step),
        "fit_batches": tuple(batch * step for batch in plan.fit_batches),
        "max_batch_size": plan.max_batch_size * step,
        "points": [point.model_copy(update={"batch_size": point.batch_size * step})
                   for point in plan.points]})


def plan_batch_on_line(report_at: Callable[[int], DeviceReport], usable_bytes: int,
                       step: int, low: int, high: int) -> BatchPlan:
    """The largest batch (a multiple of ``step``) of a step whose live bytes grow linearly
    with the batch from ``low`` on (a pipeline rank: each microbatch adds its receive
    buffers, and under GPipe its activations; what is in flight stops growing), on the
    line through the traces at ``low`` and ``high``: live bytes on the line, the allocator's
    reserve as at ``high`` (reserved ÷ allocated); each stage of a pipeline on its own line,
    the answer the batch where the first of them reaches the budget. Not ``confirmed``: no trace at the
    answer, whose trace would run every one of its microbatches. Below ``low`` the plan
    is searched by tracing (those traces are short)."""
    at_low, at_high = report_at(low), report_at(high)
    if at_low.total_bytes > usable_bytes:
        return plan_batch_in_steps(report_at, usable_bytes, step)
    return _line_plan(at_low, at_high, usable_bytes, step, low, high)


def plan_batch_below(report_at: Callable[[int], DeviceReport], usable_bytes: int, step: int,
                     over: int) -> BatchPlan:
    """About the largest batch below ``over``, a batch (a multiple of ``step``) traced
    already that does not fit: on the line through it and the smallest batch (one trace
    more), as ``plan_batch_on_line`` draws it. Not ``confirmed``; where the smallest batch
    does not fit either, the plan says so (``max_batch_size`` 0), confirmed by that trace."""
    at_low, at_over = report_at(step), report_at(over)
    if not _fits(at_low, usable_bytes):
        reports = {step: at_low, over: at_over}
        fitting = {batch: _fits(report, usable_bytes) for batch, report in reports.items()}
        return _plan(usable_bytes, (step, over), 0, True, reports, fitting)
    return _line_plan(at_low, at_over, usable_bytes, step, step, over)


def _fits(report: DeviceReport, usable_bytes: int) -> bool:
    """The report's own verdict (the allocator replayed at the limit), else its total."""
    return report.total_bytes <= usable_bytes if report.fits is None else report.fits


def _line_plan(at_low: DeviceReport, at_high: DeviceReport, usable_bytes: int, step: int,
               low: int, high: int) -> BatchPlan:
    # the allocator's reserve as at the larger traced batch that fits: one that does not was
    # replayed at the limit, its cache freed and retried, and its reserve is not the step's
    sized = at_high if _fits(at_high, usable_bytes) else at_low
    context = sized.context_bytes
    reserve = (sized.total_bytes - context) / max(sized.peak_allocated_bytes, 1)
    budget = (usable_bytes - context) / reserve
    lines = _stage_lines(at_low, at_high)
    answers = [_largest_on_line(low, low_bytes, high, high_bytes, budget)
               for low_bytes, high_bytes in lines]
    binding = answers.index(min(answers))         # the stage that reaches the budget first
    largest = max(low, min(answers[binding], MAX_BATCH) // step * step)
    low_bytes, high_bytes = lines[binding]
    slope = (high_bytes - low_bytes) / (high - low)
    points = [PlanPoint(batch_size=batch, total_bytes=report.total_bytes,
                        fits=report.total_bytes <= usable_bytes,
                        allocated_bytes=report.peak_allocated_bytes,
                        compute_peak_bytes=report.compute_peak_bytes,
                        optimizer_peak_bytes=report.optimizer_peak_bytes)
              for batch, report in ((low, at_low), (high, at_high))]
    per_sample = round(slope * reserve)
    model_bytes = round(context + reserve * (low_bytes - slope * low))
    return BatchPlan(usable_bytes=usable_bytes, model_bytes=model_bytes,
                     per_sample_bytes=per_sample, fit_batches=(low, high),
                     max_batch_size=largest, confirmed=False, points=points)


def _stage_lines(at_low: DeviceReport, at_high: DeviceReport) -> list[tuple[int, int]]:
    """Each stage's allocated bytes at the two batches (its live peak, plus what the largest
    stage allocates beyond its own live peak: workspaces); one line without stages. The
    stages grow at different rates (a middle stage receives activations and gradients for
    every microbatch, the first and last only one of them), so the largest at the traced
    batches need not be the largest further on."""
    low_stages, high_stages = at_low.stage_peak_bytes, at_high.stage_peak_bytes
    if not low_stages or len(low_stages) != len(high_stages):
        return [(at_low.peak_allocated_bytes, at_high.peak_allocated_bytes)]
    low_extra = at_low.peak_allocated_bytes - max(low_stages)
    high_extra = at_high.peak_allocated_bytes - max(high_stages)
    return [(low_peak + low_extra, high_peak + high_extra)
            for low_peak, high_peak in zip(low_stages, high_stages)]


def _largest_on_line(low: int, low_bytes: int, high: int, high_bytes: int,
                     budget: float) -> int:
    slope = (high_bytes - low_bytes) / (high - low)
    if slope <= 0:
        return MAX_BATCH if low_bytes <= budget else low
    return int((budget - (low_bytes - slope * low)) // slope)


def _few_fit(report: DeviceReport, usable_bytes: int) -> int | None:
    """Where batch 1's bytes that grow with the batch (activations, inputs, temporaries) say
    that batch ``FIT_BATCHES[1]`` would not fit: the batch they say would (at least 2), traced
    second instead of one that only brackets from far above. Batch 1's growing bytes hold
    some that do not grow (a mixed-precision step's weight copies), so the answer often lies
    above it, and the line through batch 1 and it steers better than one through batches 1
    and 2, whose totals the allocator's rounding can keep level. None where batch 8 fits."""
    breakdown = getattr(report, "breakdown", None)
    if breakdown is None:
        return None
    growing = breakdown.activations + breakdown.input_batch + breakdown.temporaries
    if report.total_bytes + (FIT_BATCHES[1] - 1) * growing <= usable_bytes:
        return None
    return max(FIT_BATCHES[0] + 1, 1 + (usable_bytes - report.total_bytes) // max(growing, 1))


UNTRAINABLE = "cannot train"
"""A batch whose trace failed below a batch that traces: the model's own code refuses that
batch (BatchNorm over one value per channel at batch 1), on a GPU as in the trace."""


def _fit_batches(reports: dict[int, DeviceReport], best: int) -> tuple[int, int]:
    """The line's two batches: the smallest traced one (batch 1 unless the model cannot
    train there) and the planned batch, or the next traced one when they coincide."""
    small, large = FIT_BATCHES
    traced = sorted(batch for batch, report in reports.items() if report.method == "traced")
    low = traced[0] if traced else small
    high = max(large, best)
    if high not in reports:     # batch 8 skipped: the walk up from 2 gave the line
        high = max(reports)
    if high <= low:
        above = [batch for batch in traced if batch > low]
        return (low, above[0]) if above else (small, large)
    return low, high


def _method(batch: int, report: DeviceReport, reports: dict[int, DeviceReport]) -> str:
    """The point's method: ``cannot train`` for a failed trace below one that worked."""
    if report.method != "traced" and any(
            other.method == "traced" for size, other in reports.items() if size > batch):
        return UNTRAINABLE
    return report.method


def _search(measure: Callable[[int], int], totals: dict[int, int], fitting: dict[int, bool],
            usable_bytes: int, max_steps: int, floors: dict[int, int] | None = None) -> int:
    """Largest traced batch that fits, tracing until the next one up is known not to.

    Secant steps through the bracket's ends; after two steps that land on the same side,
    one bisection step, so a curved total still converges (Illinois-style safeguard).
    Without a ceiling yet, the totals of fitting batches flatten near the capacity (the
    replay frees its cache and retries), so the next probe is the first batch whose floor
    (allocated bytes, growing as they did from the smallest batch) exceeds the usable
    memory, a batch that cannot fit: a tight bracket instead of an eightfold jump.
    """
    sides: list[bool] = []
    for _ in range(max_steps):
        over = [batch for batch in totals if not fitting[batch]]
        ceiling = min(over) if over else None
        best = max(batch for batch in totals if fitting[batch]
                   and (ceiling is None or batch < ceiling))
        if ceiling is not None and ceiling - best <= _resolution(best) or best >= MAX_BATCH:
            return best
        candidate = _next_batch(totals, floors, sorted(over), best, ceiling, usable_bytes,
                                sides)
        measure(candidate)
        sides.append(fitting[candidate])
    over = [batch for batch in totals if not fitting[batch]]
    return max(batch for batch in totals if fitting[batch] and (not over or batch < min(over)))


def _next_batch(totals: dict[int, int], floors: dict[int, int] | None, over: list[int],
                best: int, ceiling: int | None, usable_bytes: int, sides: list[bool]) -> int:
    """The next batch to trace. ``over``: the batches that did not fit, ascending;
    ``sides``: whether each step so far fitted."""
    bisect = len(sides) >= 2 and sides[-1] == sides[-2]
    if floors and ceiling is None and (bisect or best > FIT_BATCHES[1]):
        return floor_ceiling(floors, best, usable_bytes)
    if not floors or ceiling is None or (len(sides) >= 3 and len(set(sides[-3:])) == 1):
        return next_candidate(totals, best, ceiling, usable_bytes, bisect)
    guess = floor_secant(totals, floors, best, ceiling, usable_bytes)
    above = [batch for batch in over if batch > best]
    if guess == ceiling - 1 and sides and not sides[-1] and len(above) > 1:   # crawling down
        return over_secant(totals, best, above[0], above[1], usable_bytes)
    if bisect and sides[-1]:
        return next_candidate(totals, best, ceiling, usable_bytes, bisect)
    return guess


def _resolution(batch: int) -> int:
    return 1 if batch <= EXACT_UP_TO else batch // RELATIVE_RESOLUTION


def _plan(usable_bytes: int, fit_batches: tuple[int, int], best: int, confirmed: bool,
          reports: dict[int, DeviceReport], fitting: dict[int, bool]) -> BatchPlan:
    batch_a, batch_b = fit_batches
    total_a, total_b = reports[batch_a].total_bytes, reports[batch_b].total_bytes
    per_sample = max(0, round((total_b - total_a) / ((batch_b - batch_a) or 1)))
    points = [PlanPoint(batch_size=batch, total_bytes=report.total_bytes, fits=fitting[batch],
                        method=_method(batch, report, reports),
                        allocated_bytes=report.peak_allocated_bytes,
                        compute_peak_bytes=report.compute_peak_bytes,
                        optimizer_peak_bytes=report.optimizer_peak_bytes,
                        offloaded_bytes=getattr(report, "offloaded_bytes", 0) or 0)
              for batch, report in sorted(reports.items())]
    return BatchPlan(usable_bytes=usable_bytes, model_bytes=total_a - batch_a * per_sample,
                     per_sample_bytes=per_sample, fit_batches=fit_batches, max_batch_size=best,
                     confirmed=confirmed, points=points)
