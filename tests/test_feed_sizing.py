"""The feeding verdict of an estimate from what the probe measured: the worker's time per
batch for the rows with workers, the probe's own process's for the row without."""

import pytest

from tests.fixtures.host_datasets import SPIN_SECONDS
from memcalc.pipeline import estimate
from memcalc.specs import TrainingSpec

BATCH = 4
STEP_S = 0.02


def test_the_zero_worker_row_is_the_training_process_building_its_own_batches():
    # samples cost SPIN_SECONDS of CPU in the training process, twice that in a worker
    spec = TrainingSpec(model="mlp", model_args={"in_features": 32, "hidden": 16, "depth": 1},
                        sample_shape=(3, 32, 32), batch_size=BATCH,
                        loader={"dataset": "tests.fixtures.host_datasets:costlier_in_workers",
                                "probe_seconds": 2},
                        feed={"step_time_s": STEP_S}, machine={"cpus": 2, "ram_bytes": 16 << 30})
    report = estimate(spec)
    measured, rows = report.host.measurement, report.throughput.by_workers
    # with a core to itself, whatever else the machine runs
    assert measured.main_build_seconds == pytest.approx(BATCH * SPIN_SECONDS, rel=0.3)
    assert measured.core_seconds_per_sample == pytest.approx(2 * SPIN_SECONDS, rel=0.3)
    assert rows[0].expected_gpu_utilization == pytest.approx(
        STEP_S / (STEP_S + measured.main_build_seconds))
    # one worker on the other core: its own time sets the pace
    assert rows[1].expected_gpu_utilization == pytest.approx(
        STEP_S / (BATCH * measured.core_seconds_per_sample), rel=0.1)
    assert any("measured in the probe's own process" in line
               for line in report.throughput.assumptions)
