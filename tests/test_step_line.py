"""Lines through a step's traces: drawn by two, checked by a third, dropped by a trace off a
checked line; and a batch plan searched on a line is the plan searched by tracing every
batch, in fewer traces."""

from __future__ import annotations

from memcalc.api import training_spec
from memcalc.pipeline import _prepare
from memcalc.planned_batch import batch_plan
from memcalc.trace.step_line import StepLine
from tests.test_affine_trace import _trace


def _affine(batch: int):
    return _trace([100 + 8 * batch, 64], batch)


def _square(batch: int):
    return _trace([100 + 8 * batch * batch, 64], batch)


def test_two_traces_draw_a_line_that_a_third_checks():
    line = StepLine()
    assert line.observe(1, _affine(1)) and line.observe(4, _affine(4))
    assert line.at(9) is None                       # not checked yet
    assert line.at(9, tentative=True) == _affine(9)
    assert line.observe(6, _affine(6)) and line.checked
    assert line.at(9) == _affine(9)
    assert "batches 1, 4 and 6" in line.assumptions([9])[0]


def test_a_trace_off_a_checked_line_drops_lines_for_the_step():
    line = StepLine()
    for batch in (1, 2, 3):
        line.observe(batch, _affine(batch))
    assert not line.observe(7, _square(7))
    assert line.dropped and line.at(9) is None and line.at(9, tentative=True) is None
    assert line.observe(8, _square(8)) and line.at(9, tentative=True) is None


def test_a_trace_off_an_unchecked_line_redraws_it_through_the_last_two():
    line = StepLine()
    line.observe(1, _square(1))
    line.observe(2, _square(2))
    assert line.at(3, tentative=True) is not None
    assert not line.observe(3, _square(3))          # what the line gave must be made again
    assert not line.dropped and not line.checked
    assert line.at(4, tentative=True) == _trace([100 + 8 * (5 * 4 - 6), 64], 4)


def _plans(model: str, shape: tuple[int, ...], gpu_memory: int, **options):
    """The plan searched on lines and searched by tracing every batch, and the traces each
    made."""
    spec = training_spec(model, shape, gpu_memory_bytes=gpu_memory, **options)
    on_line, traced = _prepare(spec, None), _prepare(spec, None)
    traced.line = StepLine(dropped="compared with a search that traces every batch")
    usable = on_line.target.usable_bytes
    return ((batch_plan(on_line, usable, 1), on_line), (batch_plan(traced, usable, 1), traced))


def test_a_plan_on_the_line_is_the_plan_by_tracing_in_fewer_traces():
    (plan, on_line), (truth, traced) = _plans(
        "tests.fixtures.compiled_models:conv_bn_relu", (3, 32, 32), 1536 << 20,
        model_args={"channels": 16, "depth": 3})
    assert plan.max_batch_size == truth.max_batch_size > 8 and plan.confirmed
    assert len(on_line.traces) < len(traced.traces)
    lined = [point for point in plan.points if point.method == "line"]
    assert lined
    totals = {point.batch_size: point.total_bytes for point in truth.points}
    assert all(totals[p.batch_size] == p.total_bytes for p in plan.points if p.batch_size in totals)


def test_a_plan_of_a_step_off_its_line_is_the_plan_by_tracing():
    (plan, on_line), (truth, _) = _plans("tests.fixtures.models:gram", (64,), 1 << 30)
    assert on_line.line_breaks        # a line was drawn, and a trace found the step off it
    assert plan.max_batch_size == truth.max_batch_size and plan.confirmed == truth.confirmed
    assert all(point.method != "line" for point in plan.points)
