"""The candidates: single-GPU variants traced on their own, distributed ones derived in
closed form from a traced variant's linear batch model."""

from __future__ import annotations

import math
from dataclasses import dataclass

from memcalc.errors import TraceError
from memcalc.device.speed import compute_seconds
from memcalc.device.gpus import GpuSpec
from memcalc.pipeline import estimate, training_step_flops
from memcalc.report.models import Report
from memcalc.specs import Precision, TrainingSpec
from memcalc.strategies.cost import (
    all_reduce_seconds,
    bandwidth_bytes_per_s,
    fsdp_seconds,
)
from memcalc.strategies.launch import per_process_host
from memcalc.strategies.report import Candidate
from memcalc.strategies.sharding import (
    ZERO_STAGE,
    ModelStates,
    ddp_bucket_bytes,
    gathered_unit_bytes,
    sharded_state_bytes,
)
from memcalc.strategies.specs import ClusterSpec, Strategy
from memcalc.units import format_bytes

HOST_LINK_BYTES_PER_S = 25e9
"""PCIe 4.0 x16 between GPU and pinned host memory, one direction."""
DISTRIBUTED = (Strategy.DDP, Strategy.DATA_PARALLEL, Strategy.ZERO1, Strategy.ZERO2,
               Strategy.FSDP, Strategy.PIPELINE)


@dataclass(frozen=True)
class TracedVariant:
    """One single-GPU configuration, traced and planned."""

    strategy: Strategy
    spec: TrainingSpec
    report: Report
    flops_per_sample: float
    convolution_fraction: float = 0.0

    def compute_seconds(self, flops: float, gpu, mfu: float) -> float:
        return compute_seconds(flops, gpu, self.spec.precision, mfu, self.convolution_fraction,
                               self.spec.cudnn_tf32)

    @property
    def label(self) -> str:
        return self.strategy.value


def traced_variant(strategy: Strategy, spec: TrainingSpec) -> TracedVariant:
    report = estimate(spec.with_changes(batch_size=None))
    try:
        flops = training_step_flops(spec, 1)
    except TraceError:
        return TracedVariant(strategy, spec, report, 0.0)
    return TracedVariant(strategy, spec, report, float(flops.total), flops.convolution_fraction)


def mixed_precision_for(gpu: GpuSpec) -> Precision:
    """bf16 autocast where the card has bf16 tensor cores (Ampere on), else fp16."""
    return Precision.BF16_MIXED if gpu.bf16_tflops else Precision.FP16_MIXED


def host_offload_cap(variant: TracedVariant, processes: int) -> int | None:
    """Largest batch whose offloaded activations fit the host RAM one of ``processes`` GPU
    processes per node has, next to its own share of the host plan (its DataLoader workers
    planned for that share); None without offloading."""
    device, host = variant.report.device, variant.report.host
    if not device.offloaded_bytes or host is None:
        return None
    share = per_process_host(host, processes)
    per_sample = device.offloaded_bytes / device.batch_size
    others = share.peak_bytes - device.offloaded_bytes
    return max(0, int((share.usable_bytes - others) // per_sample))


def single_gpu_candidate(variant: TracedVariant, cluster: ClusterSpec, gpu: GpuSpec) -> Candidate:
    plan = variant.report.device.plan
    micro = plan.max_batch_size
    cap = host_offload_cap(variant, 1)
    if cap is not None and cap < micro:
        micro = cap
    steps, global_batch = _accumulation(cluster.global_batch, micro, 1)
    peak = (variant.report.device.total_bytes if micro == plan.max_batch_size   # traced there
            else _peak(plan.model_bytes, plan.per_sample_bytes, micro))
    compute = steps * variant.compute_seconds(variant.flops_per_sample * max(micro, 1), gpu,
                                              cluster.mfu)
    notes = []
    offloaded = variant.report.device.offloaded_bytes
    transfer = steps * 2 * offloaded / HOST_LINK_BYTES_PER_S
    if cap is not None and cap < plan.max_batch_size:
        notes.append(f"batch limited to {cap} by host RAM for the offloaded activations")
    if offloaded:
        notes.append(f"needs {format_bytes(offloaded)} of pinned host RAM per GPU process for "
                     "the offloaded activations; their copies out and back are timed at "
                     f"{HOST_LINK_BYTES_PER_S / 1e9:g} GB/s, not overlapped")
    if steps > 1 and variant.strategy is not Strategy.ACCUMULATION:
        notes.append("accumulating needs the gradients kept between micro-batches; see the "
                     "'accumulation' candidate for that peak")
    return _candidate(variant.strategy, variant.label, 1, "traced", peak, micro, steps,
                      global_batch, variant.flops_per_sample * max(micro, 1) * steps, compute,
                      transfer, notes)


@dataclass(frozen=True)
class _Line:
    """bytes(b) = fixed + per_sample × b."""

    fixed: float
    per_sample: float

    def at(self, batch: int) -> float:
        return self.fixed + self.per_sample * batch

    def largest_batch(self, budget: float) -> int:
        if self.per_sample <= 0:
            return 1 << 24 if self.fixed <= budget else 0
        return max(0, math.floor((budget - self.fixed) / self.per_sample))


def _lines(base: TracedVariant) -> tuple[_Line, _Line, float]:
    """The traced compute and optimizer-step lines (live tensor bytes) and the allocator's
    reserve ratio, from the base's two fitted plan points."""
    plan = base.report.device.plan
    points = {point.batch_size: point for point in plan.points}
    low, high = (points[b] for b in plan.fit_batches)
    span = high.batch_size - low.batch_size

    def line(field: str) -> _Line:
        slope = (getattr(high, field) - getattr(low, field)) / span
        return _Line(getattr(low, field) - slope * low.batch_size, slope)

    context = base.report.device.context_bytes or 0
    reserve = (high.total_bytes - context) / high.allocated_bytes
    return line("compute_peak_bytes"), line("optimizer_peak_bytes"), reserve


def distributed_candidate(strategy: Strategy, base: TracedVariant, gpus: int,
                          cluster: ClusterSpec, gpu: GpuSpec, states: ModelStates) -> Candidate:
    """``strategy`` over ``gpus`` GPUs, derived from ``base``'s traced compute and optimizer
    lines: sharded states leave both, the optimizer's temporaries shrink with the shard.
    For ``spatial`` the base is traced on one GPU's slab (``base.spec.spatial_parts``)."""
    device, plan = base.report.device, base.report.device.plan
    notes: list[str] = []
    compute, step, reserve = _lines(base)
    compute, step, data_ranks = _strategy_lines(strategy, base, gpus, cluster, states, compute,
                                                step, notes)
    context = device.context_bytes or 0
    budget = (plan.usable_bytes - context) / reserve
    micro = min(compute.largest_batch(budget), step.largest_batch(budget), 1 << 24)
    cap = host_offload_cap(base, cluster.gpus_per_node_for(gpus))
    if cap is not None and cap < micro:
        micro = cap
        notes.append(f"batch limited to {cap} by host RAM for the offloaded activations")
    peak = int(max(compute.at(max(micro, 1)), step.at(max(micro, 1))) * reserve + context)
    steps, global_batch = _accumulation(cluster.global_batch, micro, data_ranks)
    if strategy is Strategy.PIPELINE and micro >= 1:
        steps = max(steps, 2 * gpus)       # micro-batches in flight keep the bubble small
        global_batch = steps * micro
    # every GPU of a spatial group computes its own slab of the same samples
    flops = base.flops_per_sample * max(micro, 1) * steps * (
        gpus if strategy is Strategy.SPATIAL else data_ranks)
    compute_s = _distributed_compute(strategy, base, flops, gpus, steps, cluster, gpu)
    bandwidth = bandwidth_bytes_per_s(cluster, gpus)
    halo_per_sample = device.halo_exchange_bytes / max(device.batch_size, 1)
    communication = (_communication(strategy, states, gpus, bandwidth)
                     + steps * 2 * halo_per_sample * max(micro, 1) / bandwidth
                     + steps * 2 * device.offloaded_bytes / HOST_LINK_BYTES_PER_S)
    parts, spatial = base.spec.spatial_parts, strategy is Strategy.SPATIAL
    name = f"spatial×{parts}" if spatial else strategy.value
    label = name if base.strategy is Strategy.BASELINE else f"{name} + {base.label}"
    method = f"traced slab (1/{parts}) of {base.label}" if spatial else f"derived from {base.label}"
    return _candidate(strategy, label, gpus, method, peak, micro, steps, global_batch, flops,
                      compute_s, communication, notes, spatial_parts=parts)


def _strategy_lines(strategy: Strategy, base: TracedVariant, gpus: int, cluster: ClusterSpec,
                    states: ModelStates, compute: _Line, step: _Line, notes: list[str]
                    ) -> tuple[_Line, _Line, int]:
    """The compute and optimizer-step lines under ``strategy``, and its data-parallel ranks."""
    data_ranks = gpus
    if strategy in (Strategy.DDP, Strategy.SPATIAL):
        buckets = ddp_bucket_bytes(states, cluster.gradient_as_bucket_view)
        compute, step = _shift(compute, buckets), _shift(step, buckets)
        notes.append("gradient buckets: a flat copy of the gradients"
                     if not cluster.gradient_as_bucket_view else "gradient_as_bucket_view")
    if strategy is Strategy.SPATIAL:
        parts = base.spec.spatial_parts
        data_ranks = gpus // parts
        notes.append(f"every sample split over {parts} GPUs along its longest spatial axis, "
                     "halos exchanged in every padded convolution (traced on one slab)"
                     + (f"; {data_ranks} such groups data-parallel" if data_ranks > 1 else ""))
        notes.append(f"process groups: init_device_mesh('cuda', ({data_ranks}, {parts}), "
                     "mesh_dim_names=('data', 'spatial')); halos within 'spatial', gradients "
                     "all-reduced over both")
    elif strategy in (Strategy.ZERO1, Strategy.ZERO2, Strategy.FSDP):
        stage = ZERO_STAGE[strategy.value]
        sharded = sharded_state_bytes(states, gpus, stage)
        unsharded = 1 - 1 / gpus
        # forward/backward: sharded optimizer state (and parameters at stage 3) leave; the
        # gathered units join; gradients are conservatively kept as traced
        compute = _shift(compute, gathered_unit_bytes(states, stage) - unsharded * (
            states.optimizer_state_bytes + (states.parameter_bytes if stage >= 3 else 0)))
        # optimizer step: only the shard is stepped, so its temporaries shrink too
        step = _Line(sharded + (step.fixed - states.total_bytes) / gpus, step.per_sample)
    elif strategy is Strategy.DATA_PARALLEL:
        device = base.report.device
        per_input_sample = base.report.static.input_batch_bytes / max(device.batch_size, 1)
        compute = _Line(compute.fixed, compute.per_sample + (gpus - 1) * per_input_sample)
        notes.append("legacy nn.DataParallel: GPU0 scatters every GPU's inputs and gathers "
                     "outputs; one process, slower than DDP")
    elif strategy is Strategy.PIPELINE:
        compute = _Line(compute.fixed / gpus, compute.per_sample)
        step = _Line(step.fixed / gpus, step.per_sample)
        data_ranks = 1
        notes.append(f"{gpus} stages; the first stage keeps {gpus} micro-batches of its "
                     "layers' activations (1F1B), about one full micro-batch")
    return compute, step, data_ranks


def _shift(line: _Line, nbytes: float) -> _Line:
    return _Line(line.fixed + nbytes, line.per_sample)


def _distributed_compute(strategy, base, flops, gpus, steps, cluster, gpu) -> float:
    per_gpu = base.compute_seconds(flops / gpus, gpu, cluster.mfu)
    if strategy is Strategy.PIPELINE:
        return per_gpu * (steps + gpus - 1) / steps      # the pipeline bubble
    return per_gpu


def _communication(strategy: Strategy, states: ModelStates, gpus: int, bandwidth: float) -> float:
    if strategy in (Strategy.DDP, Strategy.DATA_PARALLEL, Strategy.ZERO1, Strategy.ZERO2,
                    Strategy.SPATIAL):
        return all_reduce_seconds(states.gradient_bytes, gpus, bandwidth)
    if strategy is Strategy.FSDP:
        return fsdp_seconds(states.parameter_bytes, states.gradient_bytes, gpus, bandwidth)
    return 0.0   # pipeline: activations between stages, small next to the states


def _accumulation(global_batch: int | None, micro: int, ranks: int) -> tuple[int, int]:
    if micro < 1:
        return 1, 0
    if global_batch is None:
        return 1, micro * ranks
    steps = math.ceil(global_batch / (micro * ranks))
    return steps, steps * micro * ranks


def _peak(model_bytes: int, per_sample: int, micro: int) -> int:
    return model_bytes + max(micro, 1) * per_sample


def _candidate(strategy, label, gpus, method, peak, micro, steps, global_batch, flops, compute,
               communication, notes, spatial_parts: int = 1) -> Candidate:
    step_time = compute + communication
    return Candidate(
        strategy=strategy, label=label, gpus=gpus, spatial_parts=spatial_parts, method=method,
        per_gpu_peak_bytes=peak, max_batch_size=micro, accumulation_steps=steps,
        global_batch_size=global_batch, flops_per_step=flops, compute_s=compute,
        communication_s=communication, step_time_s=step_time, samples_per_s=global_batch / step_time if step_time else 0.0,
        fits=micro >= 1, notes=notes)
