"""memcalc against real GPU measurements published by others (tests/fixtures/published_cases.py).

Tolerances: ±5 % on allocated and reserved, ±10 % on the nvidia-smi total.
"""

import pytest

from tests.fixtures.published_compare import error_rows, predicted
from tests.fixtures.published_cases import PUBLISHED_CASES

TOLERANCE_PERCENT = {"allocated": 5.0, "reserved": 5.0, "nvidia-smi": 10.0}


def test_there_are_at_least_five_cases_with_sources():
    assert len(PUBLISHED_CASES) >= 5
    assert all(case.source.startswith("https://") and case.hardware for case in PUBLISHED_CASES)


@pytest.mark.slow
@pytest.mark.parametrize("case", PUBLISHED_CASES, ids=lambda case: case.name)
def test_prediction_is_within_tolerance_of_the_measurement(case):
    rows = error_rows(case, predicted(case))
    assert rows
    for figure, measured, guess, error in rows:
        assert abs(error) <= TOLERANCE_PERCENT[figure], (figure, measured, guess)
