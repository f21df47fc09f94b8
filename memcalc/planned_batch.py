"""The batch a report is made at and the plan of the largest batch: searched on the line its
traces lie on (``memcalc.trace.step_line``; the answer traced, and searched again by tracing
where it is off the line), or on the line through two traced batches where a trace grows with
the batch (a pipeline's microbatches, a sliding window's windows); and the largest batch on
each common card."""

from __future__ import annotations

from collections.abc import Callable

from memcalc.device.batch_search import plan_batch_in_steps, plan_batch_on_line
from memcalc.device.card_fit import COMMON_CARDS, card_fits
from memcalc.device.report import BatchPlan, CardFit, DeviceReport, WindowPlan
from memcalc.device.window_search import plan_sw_batch
from memcalc.model.sliding_window import windows_per_volume
from memcalc.prepared_step import PreparedStep
from memcalc.specs import TrainingSpec


def batch_plan(prepared: PreparedStep, usable: int, step: int) -> BatchPlan:
    """The batch plan in multiples of ``step``: searched by tracing; on the line through two
    traced batches where a trace runs every microbatch (a pipeline) or every window (a
    sliding window), so large batches are not traced."""
    line = line_batches(prepared.spec)
    if line is not None:
        return plan_batch_on_line(prepared.device_report, usable, step, *line)
    job_batch = prepared.spec.batch_size    # traced for the report whatever the search does
    prepared.tentative_line = True
    try:
        plan = plan_batch_in_steps(prepared.device_report, usable, step, job_batch)
    finally:
        prepared.tentative_line = False
    given = [point.batch_size for point in plan.points if prepared.from_line(point.batch_size)]
    if given:     # the answer is traced (else the next one up, where the line is unchecked)
        answer, breaks = plan.max_batch_size, prepared.line_breaks
        if answer in given or not prepared.line.checked:
            prepared.device_report(answer if answer in given else
                                   min((batch for batch in given if batch > answer),
                                       default=max(given)), real=True)
        if prepared.line_breaks != breaks:
            # the trace was off the line: searched again (by tracing, until a line is checked)
            plan = plan_batch_in_steps(prepared.device_report, usable, step, job_batch)
    return on_line_marked(plan, prepared)


def on_line_marked(plan: BatchPlan, prepared: PreparedStep) -> BatchPlan:
    """The plan with the points the line gave (not traced) marked ``line``."""
    return plan.model_copy(update={"points": [
        point.model_copy(update={"method": "line"}) if prepared.from_line(point.batch_size)
        else point for point in plan.points]})


def line_batches(spec: TrainingSpec) -> tuple[int, int] | None:
    if spec.evaluated_window is not None:
        return 1, 2
    return spec.parallel.line_batches if spec.parallel and spec.parallel.pp > 1 else None


def reported_batch(plan: BatchPlan | None, spec: TrainingSpec, step: int) -> int:
    """The batch reported when none was given: the plan's largest, but no more than the
    line's lower traced batch for a sliding window (one volume, as validation runs it) or
    its upper one for a pipeline (the plan still gives the largest)."""
    if plan is None or not plan.max_batch_size:
        return step
    line = line_batches(spec)
    top = line[0] if spec.evaluated_window else line[1] if line else plan.max_batch_size
    return min(plan.max_batch_size, top)


def card_fits_of(prepared: PreparedStep) -> list[CardFit]:
    """The largest batch on each common card, from the same traces replayed for each."""
    targets = {card: prepared.card_target(card) for card in COMMON_CARDS}
    return card_fits(prepared.card_report,
                     {card: target.usable_bytes for card, target in targets.items()},
                     {card: target.capacity_bytes for card, target in targets.items()},
                     traced=lambda: set(prepared.traces),
                     costs_no_trace=prepared.costs_no_trace)


def window_plan(prepared: PreparedStep, device: DeviceReport,
                report_of: Callable[[TrainingSpec, int], DeviceReport]) -> WindowPlan | None:
    """The largest ``sw_batch_size`` that fits at the report's batch of volumes, for a
    sliding window evaluated on a GPU of known size (``report_of(spec, batch)`` traces a
    variant); None otherwise."""
    spec, window = prepared.spec, prepared.spec.evaluated_window
    if window is None or device.capacity_bytes is None or device.method != "traced":
        return None
    spatial = prepared.layout.traced_sample_shape[1:]
    windows = windows_per_volume(window, spatial) * device.batch_size

    def report_at(size: int) -> DeviceReport:
        variant = window.model_copy(update={"sw_batch_size": size})
        return report_of(spec.with_changes(sliding_window=variant), device.batch_size)
    return plan_sw_batch(report_at, windows, window.sw_batch_size,
                         known={window.sw_batch_size: device})
