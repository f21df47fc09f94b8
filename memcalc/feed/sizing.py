"""The host side of an estimate in one pass: what RAM allows, whether the loader keeps the GPU
busy within that, then the host report at the worker count that does."""

from __future__ import annotations

from dataclasses import dataclass, replace

from memcalc.device.gpus import GpuSpec
from memcalc.device.report import DeviceReport, StaticEstimate
from memcalc.device.speed import timed_step
from memcalc.feed.model import HeapStates, ThroughputReport, feeding_report
from memcalc.host import HostSpec, WorkerMeasurement, detect_machine, host_estimate
from memcalc.host.malloc_thresholds import churns, declined, malloc_advice, malloc_fix
from memcalc.host.measure import (
    Progress, measure_worker, measured_host_estimate, with_measured_sample)
from memcalc.host.report import HostReport
from memcalc.host.workers import worker_capacity
from memcalc.specs import DeviceKind, TrainingSpec
from memcalc.units import counted


@dataclass(frozen=True)
class HostInputs:
    """What the host side takes from the rest of the estimate."""

    spec: TrainingSpec
    sample_shape: tuple[int, ...]
    input_dtype: str
    static: StaticEstimate
    device: DeviceReport
    """The device report at the batch the job runs (its batch size and FLOPs)."""
    gpu: GpuSpec | None = None
    measurement: WorkerMeasurement | None = None
    resident_worker_bytes: int = 0
    """Another loader's persistent workers alive beside this one (``HostSpec``)."""


def host_and_throughput(inputs: HostInputs, progress: Progress | None = None
                        ) -> tuple[HostReport, ThroughputReport | None]:
    """Host RAM and DataLoader workers; whether the loader keeps the GPU fed (None without a
    step time and a load time)."""
    host_spec = _host_spec(inputs)
    measurement = inputs.measurement
    if measurement is not None:
        host_spec = with_measured_sample(host_spec, measurement)
    throughput = _throughput(inputs, host_spec)
    if throughput is not None and measurement is not None:
        throughput, trained = _in_a_training_heap(inputs, host_spec, throughput, progress)
        throughput = _with_malloc_fix(inputs, host_spec, throughput, progress, trained)
    if throughput is not None:
        host_spec = host_spec.model_copy(update={"workers_needed": throughput.num_workers})
    host = (measured_host_estimate(host_spec, measurement, progress) if measurement
            else host_estimate(host_spec))
    return host, throughput


def _in_a_training_heap(inputs: HostInputs, host_spec: HostSpec, fresh: ThroughputReport,
                        progress: Progress | None
                        ) -> tuple[ThroughputReport, WorkerMeasurement | None]:
    """Where the probe's worker (forked from a fresh interpreter) maps its temporaries afresh
    for every batch, the probe again forked from a heap as a training script leaves it
    (``host.probe``): that forecast is the table, the recommendation and the head, with the
    fresh one beside it (``HeapStates``); the training state's measurement with it."""
    measured = inputs.measurement
    if not churns(measured):
        return fresh, None
    trained = measure_worker(host_spec.loader, measured.batch_size, progress=progress,
                             parent_heap="training")
    likely = _throughput(replace(inputs, measurement=trained), host_spec)
    states = HeapStates(
        num_workers=likely.num_workers,
        training_gpu_utilization=likely.expected_gpu_utilization,
        fresh_gpu_utilization=_busy_at(fresh, likely.num_workers),
        training_seconds_per_sample=trained.feeding_seconds_per_sample,
        fresh_seconds_per_sample=measured.feeding_seconds_per_sample)
    line = (f"the workers' speed depends on glibc's heap they inherit: forked from a heap as "
            f"a training script leaves it (a freed block raised its mmap threshold) a worker "
            f"built a sample in {trained.feeding_seconds_per_sample * 1e3:.3g} ms, from a fresh "
            f"interpreter's in {measured.feeding_seconds_per_sample * 1e3:.3g} ms: GPU busy "
            f"{states.training_gpu_utilization:.0%} or {states.fresh_gpu_utilization:.0%} at "
            f"{counted(likely.num_workers, 'worker')}; the table is the first (a script that "
            "starts its DataLoader before anything large was freed is the second)")
    return likely.model_copy(update={"heap_states": states,
                                     "assumptions": likely.assumptions + [line]}), trained


def _with_malloc_fix(inputs: HostInputs, host_spec: HostSpec, throughput: ThroughputReport,
                     progress: Progress | None, trained: WorkerMeasurement | None = None
                     ) -> ThroughputReport:
    """Where the worker maps its temporaries afresh for every batch, the probe again with
    glibc's thresholds fixed (``host.malloc_thresholds``): advice with both measurements where that
    is worth it, an assumption line saying why where it is not. The table stays as measured."""
    measured = inputs.measurement
    fix = malloc_fix(host_spec.loader, measured, progress)
    if fix is None:
        return throughput
    reason = declined(fix, measured, trained)
    if reason:
        return throughput.model_copy(update={"assumptions": throughput.assumptions + [reason]})
    fixed = _throughput(replace(inputs, measurement=fix.measurement), host_spec)
    workers = throughput.num_workers
    at_workers = _busy_at(fixed, workers)
    advice = malloc_advice(fix, measured, workers, throughput.expected_gpu_utilization,
                           at_workers, trained)
    states = throughput.heap_states
    return throughput.model_copy(update={
        "malloc_fix": fix, "advice": [advice] + throughput.advice,
        "heap_states": states and states.model_copy(update={"fixed_gpu_utilization": at_workers})})


def _busy_at(throughput: ThroughputReport, workers: int) -> float:
    """The forecast's GPU-busy share at ``workers`` (its own recommendation's where its table
    has no such row)."""
    rows = {row.num_workers: row.expected_gpu_utilization for row in throughput.by_workers}
    return rows.get(workers, throughput.expected_gpu_utilization)


def _host_spec(inputs: HostInputs) -> HostSpec:
    spec, device = inputs.spec, inputs.device
    return HostSpec(
        sample_shape=inputs.sample_shape, batch_size=device.batch_size,
        model_bytes=inputs.static.parameter_bytes + inputs.static.buffer_bytes,
        cpu_step_bytes=device.total_bytes if spec.device is DeviceKind.CPU else 0,
        offloaded_activation_bytes=device.offloaded_bytes,
        host_tensor_bytes=device.host_tensor_bytes,
        offloaded_state_bytes=device.offloaded_state_bytes,
        resident_worker_bytes=inputs.resident_worker_bytes,
        cuda=spec.device is DeviceKind.CUDA,
        machine=spec.machine_share(spec.machine or detect_machine()),
        loader=spec.loader.model_copy(update={"sample_dtype": spec.loader.sample_dtype
                                              or inputs.input_dtype}))


def _throughput(inputs: HostInputs, host_spec: HostSpec) -> ThroughputReport | None:
    capacity = worker_capacity(host_spec, inputs.measurement)
    load = _batch_load_time(inputs, capacity.batch_bytes)
    step = _step_time(inputs) if load is not None else None
    if step is None or load is None:
        return None
    receive_s, busy_receive_s, main_load_s = _main_process_times(inputs)
    return feeding_report(step[0], step[1], load[0], load[1],
                          max_workers=capacity.max_num_workers, cpus=host_spec.machine.cpus,
                          batch_bytes=capacity.batch_bytes, pin_memory=host_spec.pin_memory,
                          receive_s=receive_s or 0.0, busy_receive_s=busy_receive_s,
                          main_load_s=main_load_s)


def _main_process_times(inputs: HostInputs) -> tuple[float | None, ...]:
    """The probe's times for the training process itself (None where not measured): taking
    a batch from an idle worker and from a building one, and building one with no workers;
    scaled from the probe's batch to the job's as its samples are."""
    measured = inputs.measurement
    if measured is None:
        return None, None, None
    scale = inputs.device.batch_size / measured.batch_size
    return tuple(None if seconds is None else seconds * scale
                 for seconds in (measured.receive_seconds, measured.busy_receive_seconds,
                                 measured.main_build_seconds))


def _step_time(inputs: HostInputs) -> tuple[float, str] | None:
    spec, gpu, flops = inputs.spec, inputs.gpu, inputs.device.flops
    if spec.feed.step_time_s is not None:
        return spec.feed.step_time_s, "given (--step-time)"
    if gpu is None or spec.device is not DeviceKind.CUDA or flops is None:
        return None
    timed = timed_step(flops, flops.total, gpu, spec.precision, spec.cudnn_tf32, spec.feed.mfu)
    return timed.seconds, timed.how


def _batch_load_time(inputs: HostInputs, batch_bytes: int) -> tuple[float, str] | None:
    spec, measurement, batch_size = inputs.spec, inputs.measurement, inputs.device.batch_size
    if measurement is not None and measurement.feeding_seconds_per_sample > 0:
        seconds = measurement.feeding_seconds_per_sample
        how = ("with a core to itself (its waits for a CPU taken out)"
               if measurement.core_seconds_per_sample is not None else "wall time")
        return seconds * batch_size, f"measured: {seconds * 1e3:.3g} ms per sample in a real worker, {how}"
    if spec.feed.sample_time_s is not None:
        return spec.feed.sample_time_s * batch_size, "given (--sample-time)"
    if spec.feed.read_bandwidth_bytes_per_s is not None:
        return (batch_bytes / spec.feed.read_bandwidth_bytes_per_s,
                "read bandwidth (--read-bandwidth): batch bytes ÷ rate")
    return None
