"""The host side of an estimate: host RAM, then whether the loader keeps the GPU busy, then
the host plan again at the worker count that does."""

from __future__ import annotations

from memcalc.errors import TraceError
from memcalc.feed.model import ThroughputReport, feeding_report
from memcalc.device.speed import compute_seconds, peak_flops
from memcalc.device.gpus import GpuSpec
from memcalc.host import (
    HostSpec,
    WorkerMeasurement,
    detect_machine,
    host_estimate,
    measured_host_estimate,
)
from memcalc.host.measure import Progress
from memcalc.host.report import HostReport
from memcalc.report.models import DeviceReport, StaticEstimate
from memcalc.specs import DeviceKind, TrainingSpec


def host_and_throughput(spec: TrainingSpec, sample_shape: tuple[int, ...], input_dtype: str,
                        batch_size: int, static: StaticEstimate, device: DeviceReport,
                        gpu: GpuSpec | None, flops_at: callable,
                        measurement: WorkerMeasurement | None, progress: Progress | None
                        ) -> tuple[HostReport, ThroughputReport | None]:
    host_spec = HostSpec(
        sample_shape=sample_shape, batch_size=batch_size,
        model_bytes=static.parameter_bytes + static.buffer_bytes,
        cpu_step_bytes=device.total_bytes if spec.device is DeviceKind.CPU else 0,
        offloaded_activation_bytes=device.offloaded_bytes,
        cuda=spec.device is DeviceKind.CUDA, machine=spec.machine or detect_machine(),
        loader=spec.loader.model_copy(update={"sample_dtype": spec.loader.sample_dtype
                                              or input_dtype}))
    host = (measured_host_estimate(host_spec, measurement, progress) if measurement
            else host_estimate(host_spec))
    load = _batch_load_time(spec, host, measurement, batch_size)
    step = _step_time(spec, gpu, batch_size, flops_at) if load is not None else None
    if step is None or load is None:   # FLOPs are only counted when a load time needs them
        return host, None
    throughput = feeding_report(step[0], step[1], load[0], load[1], host.max_num_workers,
                                host.spec.machine.cpus, host.batch_bytes, host.spec.pin_memory)
    sized = host_estimate(host.spec.model_copy(update={"workers_needed": throughput.num_workers}),
                          host.measurement)
    return sized.model_copy(update={"fix": host.fix, "warnings": host.warnings}), throughput


def _step_time(spec: TrainingSpec, gpu: GpuSpec | None, batch_size: int, flops_at
               ) -> tuple[float, str] | None:
    if spec.feed.step_time_s is not None:
        return spec.feed.step_time_s, "given (--step-time)"
    if gpu is None or spec.device is not DeviceKind.CUDA:
        return None
    try:
        flops = flops_at(batch_size)
    except TraceError:
        return None
    seconds = compute_seconds(flops.total, gpu, spec.precision, spec.feed.mfu,
                              flops.convolution_fraction, spec.cudnn_tf32)
    rate = peak_flops(gpu, spec.precision, flops.convolution_fraction, spec.cudnn_tf32)[1]
    return seconds, (f"{flops.total:.3g} FLOPs on {gpu.name} at {spec.feed.mfu:.0%} of its "
                     f"{rate} peak (--mfu)")


def _batch_load_time(spec: TrainingSpec, host: HostReport,
                     measurement: WorkerMeasurement | None, batch_size: int
                     ) -> tuple[float, str] | None:
    if measurement is not None and measurement.seconds_per_sample > 0:
        return (measurement.seconds_per_sample * batch_size,
                f"measured: {measurement.seconds_per_sample * 1e3:.3g} ms per sample in a real worker")
    if spec.feed.sample_time_s is not None:
        return spec.feed.sample_time_s * batch_size, "given (--sample-time)"
    if spec.feed.read_bandwidth_bytes_per_s is not None:
        return (host.batch_bytes / spec.feed.read_bandwidth_bytes_per_s,
                "read bandwidth (--read-bandwidth): batch bytes ÷ rate")
    return None
