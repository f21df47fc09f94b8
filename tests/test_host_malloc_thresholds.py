"""Workers that map their temporaries afresh for every sample: seen in their page faults,
measured again with glibc's two malloc thresholds fixed, advised with both measurements."""

import platform

import pytest

from tests.fixtures.host_datasets import HEAP_TEMPORARIES, TEMPORARY_FLOATS
from memcalc.host.malloc_thresholds import (
    CHURN_FACTOR,
    CHURN_FLOOR_BYTES,
    MIN_THRESHOLD_BYTES,
    churn_warning,
    churns,
    declined,
    reuse_env,
)
from memcalc.host.report import MallocFix, WorkerMeasurement
from memcalc.pipeline import estimate
from memcalc.specs import TrainingSpec

MiB = 1 << 20
BATCH = 4
glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")


def _measured(fault_bytes, *, batch_bytes=10 * MiB, seconds=0.010, peak=100 * MiB, env=None):
    return WorkerMeasurement(
        sample_shape=(3, 32, 32), sample_dtype="float32", sample_bytes=batch_bytes // BATCH,
        batch_size=BATCH, batch_bytes=batch_bytes, main_process_bytes=0, dataset_bytes=0,
        worker_first_bytes=peak, worker_peak_bytes=peak, growth_bytes_per_batch=0.0,
        batches=20, seconds_per_sample=seconds, stopped_by="plateau",
        fault_bytes_per_batch=fault_bytes, malloc_env=env or {})


@glibc
def test_fresh_memory_beyond_the_batch_is_churn_unless_a_threshold_is_already_set():
    limit = CHURN_FACTOR * 10 * MiB + CHURN_FLOOR_BYTES
    assert churns(_measured(limit + 1))
    assert not churns(_measured(limit - 1))
    assert not churns(_measured(None))
    assert not churns(_measured(10 * limit, env={"MALLOC_TRIM_THRESHOLD_": "1"}))


def test_both_thresholds_are_set_together_at_a_power_of_two_above_the_worker_peak():
    assert reuse_env(100 * MiB) == {"MALLOC_MMAP_THRESHOLD_": str(128 * MiB),
                                    "MALLOC_TRIM_THRESHOLD_": str(128 * MiB)}
    assert reuse_env(128 * MiB)["MALLOC_MMAP_THRESHOLD_"] == str(128 * MiB)
    assert reuse_env(1 * MiB)["MALLOC_TRIM_THRESHOLD_"] == str(MIN_THRESHOLD_BYTES)


def test_the_fix_is_declined_when_no_faster_or_when_the_heap_grows():
    measured = _measured(50 * MiB)

    def fix(seconds, peak):
        return MallocFix(env=reuse_env(peak), measurement=_measured(0, seconds=seconds, peak=peak))

    assert declined(fix(0.008, 100 * MiB), measured) is None
    assert "no faster" in declined(fix(0.0095, 100 * MiB), measured)
    assert "not advised" in declined(fix(0.005, 400 * MiB), measured)
    # the heap keeping one sample's 40 MiB temporary is the fix's price, not fragmentation
    fresh = _measured(BATCH * 40 * MiB, peak=52 * MiB)
    assert declined(fix(0.005, 92 * MiB), fresh) is None
    assert "not advised" in declined(fix(0.005, 140 * MiB), fresh)


@glibc
def test_the_feed_check_warns_that_rows_depend_on_the_allocators_history():
    warning = churn_warning(_measured(50 * MiB))
    assert "MALLOC_MMAP_THRESHOLD_=134217728 MALLOC_TRIM_THRESHOLD_=134217728" in warning
    assert churn_warning(_measured(10 * MiB)) is None


@pytest.mark.slow
@glibc
def test_a_worker_mapping_40_mib_afresh_per_sample_is_advised_both_thresholds():
    # each sample goes through a temporary above glibc's largest dynamic mmap threshold
    spec = TrainingSpec(model="mlp", model_args={"in_features": 32, "hidden": 16, "depth": 1},
                        sample_shape=(3, 32, 32), batch_size=BATCH,
                        loader={"dataset": "tests.fixtures.host_datasets:fresh_temporaries",
                                "probe_seconds": 2},
                        feed={"step_time_s": 0.001}, machine={"cpus": 2, "ram_bytes": 16 << 30})
    report = estimate(spec)
    throughput, measured = report.throughput, report.host.measurement
    fix, temporaries = throughput.malloc_fix, BATCH * TEMPORARY_FLOATS * 4
    assert fix is not None, throughput.assumptions
    assert measured.fault_bytes_per_batch > temporaries / 2
    again = fix.measurement
    assert again.malloc_env == fix.env
    assert again.fault_bytes_per_batch < temporaries / 10     # reused, not mapped again
    assert again.worker_peak_bytes < 2 * again.batch_bytes + temporaries
    env = " ".join(f"{key}={value}" for key, value in fix.env.items())
    assert env in throughput.advice[0]


@pytest.mark.slow
@glibc
def test_a_worker_forked_from_a_training_scripts_heap_reuses_what_a_fresh_one_maps_afresh():
    # 3D volumes summed from four 6 MiB temporaries at once, above the sample in the heap: a
    # fresh worker's heap grows past its trim threshold for each sample and is handed back
    # (3D volumes filtered through temporaries of numpy's choosing were handed back for only
    # some samples, 0.3-5.6 batches more from run to run, with load beside it or not)
    from memcalc.host import LoaderSpec, measure_worker

    loader = LoaderSpec(dataset="tests.fixtures.host_datasets:heap_temporaries", probe_seconds=3)
    fresh = measure_worker(loader, BATCH)
    trained = measure_worker(loader, BATCH, parent_heap="training")
    assert (fresh.parent_heap, trained.parent_heap) == ("fresh", "training")
    assert churns(fresh) and not churns(trained)
    # the fresh worker maps its temporaries again for every sample, the trained one only the
    # batch it hands over (what that costs in time depends on the CPU)
    temporaries = BATCH * HEAP_TEMPORARIES * fresh.sample_bytes
    assert fresh.fault_bytes_per_batch - trained.fault_bytes_per_batch > temporaries / 2
    assert trained.fault_bytes_per_batch < 1.5 * trained.batch_bytes
