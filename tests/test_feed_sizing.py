"""The feeding verdict of an estimate from what the probe measured: the worker's time per
batch for the rows with workers, the probe's own process's for the row without."""

import pytest

from tests.fixtures.host_datasets import SPIN_SECONDS
from memcalc.pipeline import estimate
from memcalc.specs import TrainingSpec

BATCH = 4
STEP_S = 0.02


def _spec(dataset: str, probe_seconds: float) -> TrainingSpec:
    return TrainingSpec(model="mlp", model_args={"in_features": 32, "hidden": 16, "depth": 1},
                        sample_shape=(3, 32, 32), batch_size=BATCH,
                        loader={"dataset": dataset, "probe_seconds": probe_seconds},
                        feed={"step_time_s": STEP_S}, machine={"cpus": 2, "ram_bytes": 16 << 30})


def test_the_zero_worker_row_is_the_training_process_building_its_own_batches():
    # samples cost SPIN_SECONDS of CPU in the training process, twice that in a worker
    report = estimate(_spec("tests.fixtures.host_datasets:costlier_in_workers", 2))
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


def _throughput(training: float, fresh: float):
    from memcalc.feed.model import HeapStates, ThroughputReport, WorkerUtilization

    states = HeapStates(num_workers=2, training_gpu_utilization=training,
                        fresh_gpu_utilization=fresh, training_seconds_per_sample=0.003,
                        fresh_seconds_per_sample=0.010)
    return ThroughputReport(
        step_time_s=STEP_S, step_time_source="given", batch_load_time_s=0.03,
        batch_load_source="measured", workers_needed=3, num_workers=2,
        expected_gpu_utilization=training, bound="cpu",
        by_workers=[WorkerUtilization(num_workers=2, expected_gpu_utilization=training)],
        advice=[], assumptions=[], heap_states=states)


def test_heap_states_further_apart_than_ten_points_are_a_range_on_the_head():
    from memcalc.render.feed import busy_text

    assert busy_text(_throughput(0.82, 0.38)).startswith(
        "38–82% depending on glibc's heap the workers inherit (82% as a training script")
    assert busy_text(_throughput(0.82, 0.75)) == "82%"


@pytest.mark.slow
def test_a_worker_whose_speed_depends_on_the_heap_is_forecast_in_a_training_scripts():
    report = estimate(_spec("tests.fixtures.host_datasets:heap_temporaries", 3))
    throughput, states = report.throughput, report.throughput.heap_states
    assert states is not None, throughput.assumptions
    # the head and table are the training heap's forecast, the fresh probe's beside it (which
    # is faster depends on the CPU: tests/test_host_malloc_thresholds.py)
    assert throughput.expected_gpu_utilization == states.training_gpu_utilization
    assert states.fresh_seconds_per_sample == report.host.measurement.feeding_seconds_per_sample
    assert states.training_seconds_per_sample != states.fresh_seconds_per_sample
    assert any("depends on glibc's heap they inherit" in line for line in throughput.assumptions)


NODE = {"cpus": 32, "ram_bytes": 256 << 30}


def test_a_rank_of_an_eight_gpu_node_plans_its_host_side_on_an_eighth_of_the_node():
    """Eight training processes, each with its own DataLoader workers, share the node: one
    rank's host plan has 4 of its 32 CPUs and 32 GiB of its 256 GiB, so eight of them at
    their peak fit the node."""
    spec = TrainingSpec(model="mlp", model_args={"in_features": 32, "hidden": 16, "depth": 1},
                        sample_shape=(32,), batch_size=BATCH, gpu="H100-80GB", machine=NODE,
                        parallel={"strategy": "ddp", "gpus_per_node": 8})
    host = estimate(spec).host
    assert (host.spec.machine.cpus, host.limit_bytes) == (4, 32 << 30)
    assert host.max_num_workers <= 4 and 8 * (host.recommended_num_workers + 1) <= 32
    assert 8 * host.peak_bytes <= NODE["ram_bytes"]
    assert any("one of 8 training processes on the node" in note for note in host.assumptions)


def test_workers_per_process_beyond_its_share_of_the_node_are_refused():
    with pytest.raises(ValueError, match=r"num_workers 8 \(--num-workers\) is more than the 4 "
                                         r"CPUs of one of the 8 training processes"):
        TrainingSpec(model="mlp", sample_shape=(32,), machine=NODE, loader={"num_workers": 8},
                     parallel={"strategy": "ddp", "gpus_per_node": 8})
