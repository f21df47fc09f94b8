from types import SimpleNamespace

import pytest

from memcalc.device.batch_search import plan_batch as search

USABLE = 80 * 2**30


def _report(total: int, fits: bool | None = None) -> SimpleNamespace:
    """The fields of a DeviceReport the search reads."""
    return SimpleNamespace(total_bytes=total, fits=fits, method="traced",
                           peak_allocated_bytes=total // 2,
                           compute_peak_bytes=total // 3, optimizer_peak_bytes=total // 4)


def plan_batch(total_at, usable, fits_at=None):
    """The search over reports whose totals (and verdicts) come from the given functions."""
    plan, reports = search(lambda b: _report(total_at(b), fits_at(b) if fits_at else None),
                           usable)
    assert sorted(reports) == [point.batch_size for point in plan.points]
    return plan


def _largest_fitting(total_at, usable, limit=100_000):
    fitting = [batch for batch in range(1, limit) if total_at(batch) <= usable]
    return max(fitting) if fitting else 0


@pytest.mark.parametrize("total_at", [
    lambda b: 2 * 2**30 + b * 300 * 2**20,                       # straight line
    lambda b: 2**30 + b * 2**28 + (b // 7) * 20 * 2**20,         # allocator steps
    lambda b: 2**30 + b * b * 2**24,                             # curved
    lambda b: 70 * 2**30 + b * 3 * 2**30,                        # only a few samples fit
], ids=["linear", "stepped", "curved", "few"])
def test_planned_batch_is_the_largest_that_fits_and_is_confirmed(total_at):
    traced = []

    def traced_total(batch):
        traced.append(batch)
        return total_at(batch)

    plan = plan_batch(traced_total, USABLE)
    assert plan.max_batch_size == _largest_fitting(total_at, USABLE)
    assert plan.confirmed
    traced_batches = {point.batch_size for point in plan.points}
    assert {plan.max_batch_size, plan.max_batch_size + 1} <= traced_batches
    assert len(traced) == len(set(traced)) <= 18   # each batch traced once, few traces
    for point in plan.points:
        assert point.fits is (point.total_bytes <= USABLE)


@pytest.mark.parametrize("job_batch, second", [(32, 32), (5000, 5000), (1, 8)])
def test_the_job_batch_is_the_second_trace_in_place_of_batch_8(job_batch, second):
    def total_at(batch):
        return 2 * 2**30 + batch * 300 * 2**20

    asked = []
    plan, _ = search(lambda b: asked.append(b) or _report(total_at(b)), USABLE,
                     job_batch=job_batch)
    assert asked[:2] == [1, second]
    assert plan.max_batch_size == _largest_fitting(total_at, USABLE) and plan.confirmed


def test_a_job_batch_above_what_batch_one_says_fits_waits_its_turn():
    # only a few samples fit: batch 1's growing bytes say 3, traced second, not the job's 40
    def total_at(batch):
        return 70 * 2**30 + batch * 3 * 2**30

    def report_at(batch):
        report = _report(total_at(batch))
        report.breakdown = SimpleNamespace(activations=2 * 2**30, input_batch=2**30,
                                           temporaries=0)
        return report

    asked = []
    plan, _ = search(lambda b: asked.append(b) or report_at(b), USABLE, job_batch=40)
    assert asked[:2] == [1, 3]
    assert plan.max_batch_size == _largest_fitting(total_at, USABLE)


def test_the_line_goes_through_its_two_traced_batches():
    plan = plan_batch(lambda b: 5 * 2**30 + b * 2**29 + (b % 3) * 2**20, USABLE)
    totals = {point.batch_size: point.total_bytes for point in plan.points}
    low, high = plan.fit_batches
    assert low == 1 and high == plan.max_batch_size
    for batch in (low, high):
        assert abs(plan.model_bytes + batch * plan.per_sample_bytes - totals[batch]) <= high


def test_batch_one_over_capacity_plans_zero():
    plan = plan_batch(lambda b: 100 * 2**30 * b, USABLE)
    assert plan.max_batch_size == 0 and plan.confirmed
    assert [point.batch_size for point in plan.points] == [1, 8]
    assert plan.per_sample_bytes == 100 * 2**30 and plan.model_bytes == 0


def test_a_fit_predicate_decides_over_the_totals():
    # totals say batch 10 is the last under 100, but the allocator replay (the predicate)
    # fits up to 12: it frees cached blocks before an out-of-memory
    plan = plan_batch(lambda b: 10 * b, 100, lambda b: b <= 12)
    assert plan.max_batch_size == 12 and plan.confirmed
    assert {p.batch_size: p.fits for p in plan.points}[12] is True


def test_each_point_keeps_the_phase_peaks_of_its_report():
    plan = plan_batch(lambda b: 2**30 + b * 2**28, USABLE)
    for point in plan.points:
        assert point.allocated_bytes == point.total_bytes // 2
        assert point.compute_peak_bytes == point.total_bytes // 3
        assert point.optimizer_peak_bytes == point.total_bytes // 4


def test_a_search_in_steps_answers_the_largest_multiple_that_fits():
    from memcalc.device.batch_search import plan_batch_in_steps

    def total_at(batch):
        return 2 * 2**30 + batch * 300 * 2**20

    asked = []
    plan = plan_batch_in_steps(lambda b: asked.append(b) or _report(total_at(b)), USABLE, 6)
    assert all(batch % 6 == 0 for batch in asked)   # 1F1B over 6 stages: never fewer microbatches
    assert plan.max_batch_size == _largest_fitting(total_at, USABLE) // 6 * 6 == 264
    assert all(point.batch_size % 6 == 0 for point in plan.points)
    assert plan.per_sample_bytes == pytest.approx(300 * 2**20, rel=1e-6)


def test_a_line_plan_solves_for_the_budget_with_the_reserve_as_traced():
    """Allocated = 1 GiB + 100 MiB per sample, reserved 1.25 × allocated, context 500 MiB:
    the largest batch is (usable - context) / 1.25, less the fixed part, over the slope."""
    from memcalc.device.batch_search import plan_batch_on_line

    def report(batch):
        allocated = 2**30 + batch * 100 * 2**20
        return SimpleNamespace(peak_allocated_bytes=allocated, context_bytes=500 * 2**20,
                               total_bytes=int(1.25 * allocated) + 500 * 2**20,
                               compute_peak_bytes=allocated, optimizer_peak_bytes=allocated,
                               stage_peak_bytes=[], fits=None)

    plan = plan_batch_on_line(report, USABLE, 4, 8, 12)
    exact = ((USABLE - 500 * 2**20) / 1.25 - 2**30) / (100 * 2**20)
    assert plan.max_batch_size == int(exact) // 4 * 4
    assert not plan.confirmed and plan.fit_batches == (8, 12)


def test_a_line_plan_answers_by_the_stage_that_reaches_the_budget_first():
    """Stage 0 is the largest at the traced batches (8 GiB + 10 MiB per sample), stage 1
    grows faster (4 GiB + 40 MiB per sample): stage 1 binds, and the plan's line is its."""
    from memcalc.device.batch_search import plan_batch_on_line

    def report(batch):
        stages = [8 * 2**30 + batch * 10 * 2**20, 4 * 2**30 + batch * 40 * 2**20]
        return SimpleNamespace(peak_allocated_bytes=max(stages), context_bytes=0,
                               total_bytes=max(stages), compute_peak_bytes=max(stages),
                               optimizer_peak_bytes=max(stages), stage_peak_bytes=stages,
                               fits=None)

    plan = plan_batch_on_line(report, USABLE, 1, 8, 12)
    assert plan.max_batch_size == (USABLE - 4 * 2**30) // (40 * 2**20)
    assert plan.per_sample_bytes == 40 * 2**20 and plan.model_bytes == 4 * 2**30


def _capped_report(context: int, fixed: int, per_sample: int, reserve: float, usable: int):
    """A step whose reserve is ``reserve`` × allocated until the total reaches ``usable``;
    above, the allocator (replayed at the limit) frees its cache and retries: the total
    stays at the usable memory and the batch does not fit."""
    def report(batch):
        allocated = fixed + batch * per_sample
        total = context + int(reserve * allocated)
        return SimpleNamespace(peak_allocated_bytes=allocated, context_bytes=context,
                               total_bytes=min(total, usable), fits=total <= usable,
                               compute_peak_bytes=allocated, optimizer_peak_bytes=allocated,
                               stage_peak_bytes=[], method="traced")
    return report


def test_about_the_largest_batch_below_one_that_does_not_fit_takes_the_fitting_reserve():
    """The batch over the limit was replayed at capacity (its total reads as the usable
    memory, its reserve 1.0): the line takes the reserve of batch 1, which fits, and solves
    the closed form; traced: the smallest batch and the one given, nothing more."""
    from memcalc.device.batch_search import plan_batch_below

    context, fixed, per_sample, reserve = 2**29, 6 * 2**30, 81 * 2**20, 1.3
    traced = []
    report = _capped_report(context, fixed, per_sample, reserve, USABLE)
    plan = plan_batch_below(lambda batch: traced.append(batch) or report(batch), USABLE, 1,
                            10_000)
    exact = ((USABLE - context) / reserve - fixed) / per_sample
    assert abs(plan.max_batch_size - exact) <= 1 and plan.max_batch_size <= exact
    assert sorted(set(traced)) == [1, 10_000] and not plan.confirmed


def test_below_a_batch_where_not_even_the_smallest_fits_the_plan_is_zero_and_confirmed():
    from memcalc.device.batch_search import plan_batch_below

    report = _capped_report(2**29, 2 * USABLE, 2**20, 1.1, USABLE)
    plan = plan_batch_below(report, USABLE, 2, 8)
    assert plan.max_batch_size == 0 and plan.confirmed and plan.fit_batches == (2, 8)
    assert [point.batch_size for point in plan.points] == [2, 8]


def test_a_replay_that_flattens_at_capacity_is_bracketed_by_its_floor_in_few_traces():
    # at capacity the allocator frees its cache and retries: a fitting batch's total sits at
    # the usable memory whatever its size, so secant steps on totals crawled (13 traces for
    # ResNet-50 on an A100); the allocated bytes (the floor) grow on to the end
    context, fixed, per_sample, reserve = 2**29, 6 * 2**30, 81 * 2**20, 1.04

    def report(batch):
        floor = fixed + batch * per_sample
        need = round(floor * (1 + (reserve - 1) * batch / 500)) + context
        fits = need <= USABLE
        total = (USABLE if batch > 200 else need) if fits else need
        return SimpleNamespace(total_bytes=total, fits=fits, method="traced",
                               peak_allocated_bytes=floor, peak_reserved_bytes=total - context,
                               compute_peak_bytes=floor, optimizer_peak_bytes=floor)

    traced = []
    plan, _ = search(lambda batch: traced.append(batch) or report(batch), USABLE)
    truth = max(b for b in range(1, 2000) if report(b).fits)
    assert plan.max_batch_size == truth and plan.confirmed
    assert len(traced) <= 7, traced
