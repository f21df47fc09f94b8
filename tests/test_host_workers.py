"""Host arithmetic and worker counts against closed forms written out here."""

import math

import pytest
from pydantic import ValidationError

from memcalc.host.arithmetic import (
    CUDA_HOST_CONTEXT_BYTES,
    FORK_WORKER_BYTES,
    SPAWN_WORKER_BYTES,
    TORCH_PROCESS_BYTES,
    pinned_block_bytes,
)
from memcalc.host.workers import host_estimate
from memcalc.host.report import WorkerMeasurement
from memcalc.host.specs import HostSpec, LoaderSpec, MachineSpec

MIB, GIB = 1 << 20, 1 << 30
SEED_SHAPE = (834, 224, 834, 3)
SEED_SAMPLE = 834 * 224 * 834 * 3 * 4
SEED_MACHINE = MachineSpec(cpus=64, ram_bytes=188 * 10**9, shm_bytes=188 * 10**9)
"""The seeds' node, its /dev/shm as large as its RAM (18 workers found by hand need more than
Linux's default tmpfs)."""


def seed(**loader) -> HostSpec:
    return HostSpec(sample_shape=SEED_SHAPE, batch_size=2, machine=SEED_MACHINE,
                    loader=LoaderSpec(sample_dtype="float32", **loader))


def test_seed_case_lands_near_the_18_workers_found_by_hand():
    report = host_estimate(seed())
    batch = 2 * SEED_SAMPLE
    per_worker = FORK_WORKER_BYTES + 2 * SEED_SAMPLE + 2 * batch   # base, collating, prefetched
    main_at_start = TORCH_PROCESS_BYTES + CUDA_HOST_CONTEXT_BYTES + batch   # holds the first
    usable = int(0.95 * 188 * 10**9)
    assert report.per_worker_bytes == per_worker
    assert report.max_num_workers == (usable - main_at_start) // per_worker == 15
    steady_per_worker = FORK_WORKER_BYTES + 2 * batch
    assert report.max_num_workers_steady == (
        (usable - main_at_start - 2 * SEED_SAMPLE) // steady_per_worker)
    assert report.max_num_workers <= 18 <= report.max_num_workers_steady
    assert report.limited_by == "RAM" and report.fits
    names = [term.name for term in report.main_terms + report.worker_terms]
    assert names == ["python + torch", "CUDA host context", "batch being trained on",
                     "worker process", "samples being collated", "batches in shared memory"]


def test_ram_alone_assumes_linux_default_shm_of_half_of_it():
    spec = seed().model_copy(update={"machine": MachineSpec(cpus=64, ram_bytes=188 * 10**9)})
    report = host_estimate(spec)
    batch = 2 * SEED_SAMPLE
    # (2 prefetched batches per worker + the one being trained on) in a tmpfs of half the RAM
    assert report.max_num_workers == (188 * 10**9 // 2 // batch - 1) // 2 == 12
    assert report.limited_by == "/dev/shm size"
    assert report.max_num_workers_steady == 12      # in-flight batches fill /dev/shm either way
    assert any("/dev/shm assumed" in note and "half of RAM" in note
               for note in report.assumptions)


def test_totals_at_the_maximum_fit_and_one_more_does_not():
    report = host_estimate(seed())
    best = report.max_num_workers
    at_best = host_estimate(seed(num_workers=best))
    above = host_estimate(seed(num_workers=best + 1))
    assert at_best.fits and at_best.peak_bytes <= at_best.usable_bytes
    assert not above.fits and above.peak_bytes > above.usable_bytes
    assert above.peak_bytes - at_best.peak_bytes == report.per_worker_bytes


def test_no_workers_means_the_main_process_builds_the_batch():
    report = host_estimate(seed(num_workers=0))
    building = next(t for t in report.main_terms if t.name.startswith("batch being built"))
    assert building.bytes_each == 2 * SEED_SAMPLE + 2 * SEED_SAMPLE   # collated + 2 samples
    assert report.peak_bytes == (TORCH_PROCESS_BYTES + CUDA_HOST_CONTEXT_BYTES
                                 + 2 * SEED_SAMPLE + 4 * SEED_SAMPLE)
    assert report.shm_peak_bytes == 0


def test_raw_decode_and_transform_copies_add_to_the_sample_being_built():
    plain = host_estimate(seed()).per_worker_bytes
    decoded = host_estimate(seed(raw_dtype="uint8", transform_copies=1)).per_worker_bytes
    assert decoded - plain == SEED_SAMPLE // 4 + SEED_SAMPLE


def test_cpu_bound_machine_keeps_one_cpu_for_the_main_process():
    spec = HostSpec(sample_shape=(3, 64, 64), batch_size=8, cuda=False,
                    machine=MachineSpec(cpus=8, ram_bytes=64 * GIB))
    report = host_estimate(spec)
    assert report.max_num_workers == 8 and report.limited_by == "CPUs (8)"
    assert report.recommended_num_workers == 7
    assert report.sbatch[0] == "#SBATCH --cpus-per-task=8"


def test_sbatch_memory_covers_the_peak_with_headroom():
    report = host_estimate(seed())
    cpus = int(report.sbatch[0].split("=")[1])
    mem_per_cpu = int(report.sbatch[1].split("=")[1].removesuffix("M")) * MIB
    assert cpus == report.recommended_num_workers + 1
    assert mem_per_cpu * cpus >= report.peak_bytes / 0.95 > (mem_per_cpu - MIB) * cpus


def test_shared_memory_size_can_be_the_limit():
    spec = HostSpec(sample_shape=(25 * MIB,), batch_size=1, cuda=False,
                    loader=LoaderSpec(sample_dtype="uint8"),
                    machine=MachineSpec(cpus=32, ram_bytes=64 * GIB, shm_bytes=GIB))
    report = host_estimate(spec)
    # (workers × prefetch 2 + 1 held) × 25 MiB ≤ 1 GiB → 19 workers
    assert report.max_num_workers == (GIB // (25 * MIB) - 1) // 2 == 19
    assert report.limited_by == "/dev/shm size"


def test_a_machine_too_small_for_the_main_process_is_reported_not_raised():
    spec = seed().model_copy(update={"machine": MachineSpec(cpus=8, ram_bytes=4 * GIB)})
    report = host_estimate(spec)
    assert report.max_num_workers == 0 and not report.fits
    assert report.limited_by == "RAM: the main process alone does not fit"


def test_pinned_memory_uses_power_of_two_blocks_instead_of_shared_memory():
    assert pinned_block_bytes(3 * GIB + 1) == 4 * GIB and pinned_block_bytes(4 * GIB) == 4 * GIB
    pinned = host_estimate(seed(pin_memory=True, num_workers=4))
    in_flight = next(t for t in pinned.worker_terms if t.name == "batches in flight (pinned)")
    assert in_flight.bytes_each == pinned_block_bytes(2 * SEED_SAMPLE) == 4 * GIB
    assert pinned.shm_peak_bytes == (4 + 1) * 2 * SEED_SAMPLE   # only the unpinned ones
    unpinned_cpu = host_estimate(seed(pin_memory=True).model_copy(update={"cuda": False}))
    assert all("pinned" not in t.name for t in unpinned_cpu.worker_terms)


def test_spawned_workers_reimport_torch_and_receive_the_dataset():
    forked = host_estimate(seed(dataset_bytes=GIB))
    spawned = host_estimate(seed(dataset_bytes=GIB, start_method="spawn"))
    assert spawned.per_worker_bytes - forked.per_worker_bytes == (
        SPAWN_WORKER_BYTES - FORK_WORKER_BYTES + GIB)
    objects = host_estimate(seed(dataset_bytes=GIB, dataset_python_objects=True))
    assert objects.per_worker_bytes - forked.per_worker_bytes == GIB
    assert objects.recommended_persistent_workers is False
    assert any("copy a Python-object dataset" in w for w in objects.warnings)


def test_a_measured_worker_scales_with_the_batch_size():
    sample = 40 * MIB
    measured = WorkerMeasurement(
        sample_shape=(10 * MIB,), sample_dtype="float32", sample_bytes=sample, batch_size=2,
        batch_bytes=2 * sample, main_process_bytes=300 * MIB, dataset_bytes=0,
        worker_first_bytes=90 * MIB, worker_peak_bytes=100 * MIB, growth_bytes_per_batch=0.0,
        batches=20, seconds_per_sample=0.01, stopped_by="plateau", malloc_env={})
    spec = HostSpec(sample_shape=(10 * MIB,), batch_size=4, cuda=False,
                    loader=LoaderSpec(dataset="pkg:data", num_workers=2),
                    machine=MachineSpec(cpus=4, ram_bytes=64 * GIB))
    report = host_estimate(spec, measured)
    worker, collating, in_flight = report.worker_terms
    assert worker.bytes_each == 100 * MIB - 2 * sample      # what stays between batches
    assert collating.bytes_each == 4 * sample               # the 4 samples of a batch of 4
    assert in_flight.bytes_each == 4 * sample and report.batch_bytes == 4 * sample
    assert report.steady_bytes == (report.main_process_bytes + 2 * (worker.bytes_each
                                   + in_flight.total_bytes) + collating.bytes_each)
    assert report.measured and report.main_terms[0].bytes_each == 300 * MIB


def test_samples_inside_glibcs_dynamic_threshold_are_flagged(monkeypatch):
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    spec = HostSpec(sample_shape=(4, 128, 128, 64), batch_size=4, cuda=False,
                    machine=MachineSpec(cpus=4, ram_bytes=64 * GIB))
    assert any("MALLOC_MMAP_THRESHOLD_=1048576" in w for w in host_estimate(spec).warnings)
    large = spec.model_copy(update={"sample_shape": (10, 128, 128, 64)})
    assert not host_estimate(large).warnings


def test_more_workers_than_cpus_is_rejected():
    with pytest.raises(ValidationError, match=r"num_workers 65 \(--num-workers\) is more than the 64 CPUs"):
        seed(num_workers=65)


def test_more_workers_than_a_detected_machines_cpus_is_a_warning_not_a_refusal():
    """The machine memcalc runs on is often a login node: a GPU-memory answer does not fail
    on its CPU count; the host plan is made as asked and says so."""
    login = MachineSpec(cpus=2, ram_bytes=16 * GIB, source="detected")
    spec = HostSpec(sample_shape=(3, 64, 64), batch_size=8, cuda=True,
                    loader=LoaderSpec(num_workers=8), machine=login)
    report = host_estimate(spec)
    assert any("num_workers 8 is more than this machine's 2 CPUs" in w for w in report.warnings)
    with pytest.raises(ValidationError, match="more than the 2 CPUs"):   # a node given
        HostSpec(sample_shape=(3, 64, 64), batch_size=8, loader=LoaderSpec(num_workers=8),
                 machine=MachineSpec(cpus=2, ram_bytes=16 * GIB))


def test_sizes_are_exact_for_every_dtype():
    for dtype, size in (("uint8", 1), ("float16", 2), ("float64", 8)):
        spec = HostSpec(sample_shape=(7, 9), batch_size=3, cuda=False,
                        loader=LoaderSpec(sample_dtype=dtype),
                        machine=MachineSpec(cpus=2, ram_bytes=GIB))
        report = host_estimate(spec)
        assert report.sample_bytes == math.prod((7, 9)) * size
        assert report.batch_bytes == 3 * report.sample_bytes


def test_loading_the_model_holds_it_twice_before_the_workers_start():
    model = 25 * GIB
    spec = HostSpec(sample_shape=(2048,), batch_size=1, model_bytes=model,
                    loader=LoaderSpec(sample_dtype="int64"),
                    machine=MachineSpec(cpus=16, ram_bytes=64 * GIB))
    report = host_estimate(spec)
    assert report.loading_bytes == (TORCH_PROCESS_BYTES + 2 * model + CUDA_HOST_CONTEXT_BYTES)
    assert report.peak_bytes == report.loading_bytes > report.epoch_start_bytes
    assert any("mmap=True" in warning for warning in report.warnings)
    too_small = spec.model_copy(update={"machine": MachineSpec(cpus=16, ram_bytes=48 * GIB)})
    small_report = host_estimate(too_small)
    assert not small_report.fits and small_report.limited_by.startswith("RAM: loading the model")


def test_a_cpu_training_step_lives_in_the_main_process():
    step = 3 * GIB
    spec = seed(num_workers=2).model_copy(update={"cuda": False, "cpu_step_bytes": step})
    on_gpu = seed(num_workers=2).model_copy(update={"cuda": False})
    assert host_estimate(spec).main_process_bytes - host_estimate(on_gpu).main_process_bytes == step


def test_a_detected_machine_is_called_this_machine_and_the_options_named():
    detected = MachineSpec(cpus=2, ram_bytes=8 * GIB, source="detected")
    report = host_estimate(seed().model_copy(update={"machine": detected}))
    assert any("for this machine" in w and "--cpus, --ram and --shm" in w
               for w in report.warnings)
    assert not any("for this machine" in w for w in host_estimate(seed()).warnings)


def test_eight_processes_loading_a_model_the_node_holds_once_but_not_eight_times():
    """A 32 GiB model: one process loading it (module and state dict) fits a 512 GiB node;
    eight, one per GPU, need eight times that at once, more than the node has. Each one's
    share says so and names the loading that does not copy the model into every process."""
    node = MachineSpec(cpus=64, ram_bytes=512 * GIB)
    spec = HostSpec(sample_shape=(2048,), batch_size=4, model_bytes=32 * GIB, machine=node)
    alone = host_estimate(spec)
    shared = host_estimate(spec.model_copy(update={"machine": node.shared_by(8)}))
    assert alone.fits and alone.loading_bytes == shared.loading_bytes
    assert 8 * shared.loading_bytes > node.limit_bytes and not shared.fits
    assert "in each of 8 processes' share" in shared.limited_by
    assert any("torch.distributed.checkpoint" in warning for warning in shared.warnings)
    assert not any("torch.distributed.checkpoint" in warning for warning in alone.warnings)
