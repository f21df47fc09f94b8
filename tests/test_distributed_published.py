"""The traced rank of published multi-GPU trainings against the figure each source reports
(``tests/fixtures/published_distributed.py``)."""

import statistics

import pytest

from memcalc.device.batch_search import plan_batch
from memcalc.pipeline import _prepare
from tests.fixtures.published_distributed import PUBLISHED_OUTCOMES, PUBLISHED_RANKS

pytestmark = pytest.mark.slow      # 8B-parameter jobs traced rank by rank


@pytest.fixture(scope="module")
def prepared():
    return {case.name: _prepare(case.spec, None) for case in PUBLISHED_RANKS}


def _error(case, prepared) -> float:
    report = prepared[case.name].device_report(case.spec.batch_size)
    assert report.method == "traced"
    return (report.peak_reserved_bytes - case.reserved_bytes) / case.reserved_bytes


def test_published_ranks_median_within_8_percent_none_above_15(prepared):
    errors = [abs(_error(case, prepared)) for case in PUBLISHED_RANKS]
    assert statistics.median(errors) <= 0.08
    assert max(errors) <= 0.15


@pytest.mark.slow
def test_the_largest_batch_is_at_least_the_batch_that_ran(prepared):
    case = PUBLISHED_RANKS[0]
    step = prepared[case.name]
    plan = plan_batch(step.device_report, step.target.usable_bytes)[0]
    assert plan.max_batch_size is not None and plan.max_batch_size >= case.ran_batch


@pytest.mark.parametrize("case", PUBLISHED_OUTCOMES, ids=lambda case: case.name)
def test_a_batch_that_ran_fits_and_one_that_ran_out_of_memory_does_not(case):
    """The traced rank at the published batch, replayed at the card's whole capacity."""
    report = _prepare(case.spec, None).device_report(case.spec.batch_size)
    assert report.method == "traced"
    assert report.fits is case.ran, f"{report.total_bytes / 2**30:.2f} GiB"
