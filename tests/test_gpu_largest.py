"""memcalc's fit verdict near the true largest batch measured on a real GPU (no GPU needed).

The truth (``benchmarks/gpu_data/h200-largest.json``): on an H200 with the caching allocator
capped at what an emulated card leaves it, the largest batch for which two iterations of the
step trained. memcalc is given the same allocator budget. Rows where its plan was exact must
fit at the true batch and not one above; the 3D ResNet's, where memcalc plans 16 % low (its
cuDNN workspaces fragment the modelled cache more than the real allocator's), must still
never fit above the truth. All 30 rows: ``python -m benchmarks.gpu``.
"""

from __future__ import annotations

import pytest

from tests.fixtures.gpu_budget import runs_in_measured_budget
from tests.fixtures import gpu_data

ROWS = {(row["model"], row["precision"], row["card"]): row for row in gpu_data.largest()["rows"]}


@pytest.mark.parametrize("key", [("gpt2", "bf16-mixed", "24GB"), ("unet3d", "fp32", "24GB")])
def test_the_true_largest_fits_and_one_more_does_not(key):
    row = ROWS[key]
    assert row["exact"] and row["probes"][str(row["true"] + 1)] is False
    assert runs_in_measured_budget(row, [row["true"], row["true"] + 1]) == {
        row["true"]: True, row["true"] + 1: False}


def test_a_conservative_plan_never_fits_above_the_truth():
    row = ROWS[("resnet3d", "fp32", "24GB")]
    low = int(0.84 * row["true"])
    assert runs_in_measured_budget(row, [low, row["true"] + 1]) == {low: True,
                                                                   row["true"] + 1: False}
