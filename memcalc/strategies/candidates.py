"""The candidates: a traced variant on one GPU, or a derived strategy on N GPUs in closed form
on a traced variant's lines, moved by the strategy's rule (``memcalc.strategies.rules``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from memcalc.device.cuda_overheads import nccl_bytes
from memcalc.errors import TraceError
from memcalc.host.workers import host_estimate
from memcalc.strategies.cost import HOST_LINK_BYTES_PER_S, bandwidth_bytes_per_s
from memcalc.strategies.launch import per_process_host
from memcalc.strategies.lines import UNBOUNDED_BATCH, Derivation, fitted_lines
from memcalc.strategies.report import Candidate
from memcalc.strategies.specs import Strategy
from memcalc.units import format_bytes

if TYPE_CHECKING:
    from memcalc.device.gpus import GpuSpec
    from memcalc.device.report import BatchPlan, DeviceReport
    from memcalc.report.models import Report
    from memcalc.specs import TrainingSpec
    from memcalc.strategies.rules import DerivedRule
    from memcalc.strategies.sharding import ModelStates
    from memcalc.strategies.specs import ClusterSpec
    from memcalc.strategies.variants import TracedVariant, VariantEstimator

Sized = tuple[Candidate | None, str | None]
"""A derived strategy's candidate (None: none could be built) and why not, when it says."""


@dataclass(frozen=True)
class PlanContext:
    """What sizing a derived strategy sees besides its base and the states."""

    cluster: ClusterSpec
    gpu: GpuSpec
    estimator: VariantEstimator
    """For strategies that trace their own variant (one spatial slab)."""
    not_splittable: str | None = None
    """Why one sample cannot be split spatially; None: it can."""
    job_batch: int | None = None
    """The job's own batch per GPU (``--batch-size``), at which candidates also say their
    peak; None: not given."""


def rank_report(context: PlanContext, spec: TrainingSpec) -> Report:
    """The report of one rank of the job; a ``TraceError`` where its step could not be
    traced (a static count of one GPU is no rank of the job)."""
    report = context.estimator.report(spec)
    if report.device.method != "traced":
        raise TraceError(f"its trace failed: {report.trace_failure or 'static'}")
    return report


@dataclass(frozen=True)
class Batching:
    """Micro-batch per GPU, accumulation steps, and the global batch they make."""

    micro: int
    steps: int
    global_batch: int


@dataclass(frozen=True)
class Timing:
    """FLOPs and seconds of one optimizer step."""

    flops: float
    compute_s: float
    communication_s: float


def host_offload_cap(variant: TracedVariant, processes: int, largest: int) -> int | None:
    """Largest batch up to ``largest`` whose host plan fits one of ``processes`` GPU
    processes' share of the node with that batch's offloaded activations pinned beside it:
    the loader's batches and the offloaded bytes both grow with the batch, so the plan is
    redone per batch (a bisection; host plans are arithmetic). None without offloading."""
    device, host = variant.report.device, variant.report.host
    if not device.offloaded_bytes or host is None:
        return None

    def fits(batch: int) -> bool:
        spec = host.spec.model_copy(update={
            "batch_size": batch, "offloaded_activation_bytes": offloaded_at(device, batch)})
        return per_process_host(host_estimate(spec, host.measurement), processes).fits

    low, high = 0, max(0, largest)
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if fits(middle) else (low, middle - 1)
    return low


def offloaded_at(device: DeviceReport, batch: int) -> int:
    """Offloaded activation bytes at ``batch``: on the line through the batch plan's traced
    points (affine: tensors saved for backward that do not grow with the batch, such as
    weights, are offloaded too), else in proportion to the traced batch."""
    if not device.offloaded_bytes:
        return 0
    points = sorted({point.batch_size: point.offloaded_bytes for point in
                     (device.plan.points if device.plan else []) if point.offloaded_bytes}.items())
    if len(points) < 2:
        return device.offloaded_bytes * batch // max(device.batch_size, 1)
    (low, low_bytes), (high, high_bytes) = points[0], points[-1]
    slope = (high_bytes - low_bytes) / (high - low)
    return max(0, round(low_bytes + (batch - low) * slope))


def single_gpu_candidate(variant: TracedVariant, cluster: ClusterSpec, gpu: GpuSpec,
                         job_batch: int | None = None) -> Candidate:
    """``variant`` on one GPU at its planned batch (or what host RAM allows when offloading),
    accumulating to the cluster's global batch; with its peak at ``job_batch`` when given."""
    plan = variant.report.device.plan
    micro = plan.max_batch_size
    cap = host_offload_cap(variant, 1, micro)
    if cap is not None and cap < micro:
        micro = cap
    batching = accumulation(cluster.global_batch, micro, 1)
    steps, micro = batching.steps, batching.micro
    peak = (variant.report.device.total_bytes if micro == plan.max_batch_size   # traced there
            else planned_peak_at(plan, max(micro, 1)))
    compute = steps * variant.compute_seconds(variant.flops_per_sample * max(micro, 1), gpu,
                                              cluster.mfu)
    notes = []
    device = variant.report.device
    # offloaded bytes grow with the batch: at the micro-batch used, not at the traced one
    offloaded = offloaded_at(device, max(micro, 1))
    transfer = steps * 2 * offloaded / HOST_LINK_BYTES_PER_S
    if cap is not None and cap < plan.max_batch_size:
        notes.append(f"batch limited to {cap} by host RAM for the offloaded activations")
    if offloaded:
        notes.append(f"needs {format_bytes(offloaded)} of pinned host RAM per GPU process for "
                     "the offloaded activations; their copies out and back are timed at "
                     f"{HOST_LINK_BYTES_PER_S / 1e9:g} GB/s, not overlapped")
    if variant.spec.compile:
        notes.append("compiled: memory as AOTAutograd's partition and Inductor's fusion keep "
                     "it; timed as the eager step (compiling's speed-up is not modelled), and "
                     "the first step compiles for minutes")
        notes += [f"graph break, traced eager: {fallback}" for fallback in device.compile_fallbacks]
    if steps > 1 and not variant.rule.keeps_gradients:
        notes.append("accumulating needs the gradients kept between micro-batches; see the "
                     "'accumulation' candidate for that peak")
    timing = Timing(variant.flops_per_sample * max(micro, 1) * steps, compute, transfer)
    return _candidate(strategy=variant.strategy, label=variant.label, gpus=1,
                      method=_static_mark(variant, "traced"),
                      peak=peak, batching=batching, timing=timing, notes=notes,
                      job_batch_peak=planned_peak_at(variant.report.device.plan, job_batch))


def _nccl_bytes(rule: DerivedRule, kind: str, gpus: int, data_ranks: int) -> int:
    """NCCL's buffers of one process of a closed-form row on CUDA (its traced ranks count
    them in their context): a communicator for the data-parallel ranks, one for a
    pipeline's sends; legacy DataParallel runs in one process, outside a process group."""
    if kind != "cuda" or gpus < 2 or rule.strategy is Strategy.DATA_PARALLEL:
        return 0
    return nccl_bytes(dp=data_ranks, pp=gpus // max(data_ranks, 1))


def planned_peak_at(plan: BatchPlan | None, batch: int | None) -> int | None:
    """The per-GPU total at ``batch``: traced there by the batch plan, else on its line."""
    if plan is None or batch is None:
        return None
    traced = {point.batch_size: point.total_bytes for point in plan.points
              if point.method == "traced"}
    return traced.get(batch, _peak(plan.model_bytes, plan.per_sample_bytes, batch))


def _static_mark(base: TracedVariant, method: str) -> str:
    """A candidate resting on a static (untraced) estimate says so in its method."""
    if base.report.device.method == "traced":
        return method
    return f"STATIC (trace failed): {method.replace('traced', 'counted')}"


def distributed_candidate(rule: DerivedRule, base: TracedVariant, gpus: int,
                          cluster: ClusterSpec, gpu: GpuSpec, states: ModelStates,
                          job_batch: int | None = None) -> Candidate:
    """``rule``'s strategy over ``gpus`` GPUs, derived from ``base``'s traced compute and
    optimizer lines as the rule moves them; for a base traced on one GPU's share of each
    sample (``rule.traced_per_gpu``) those lines are already one GPU's. ``job_batch``: the
    job's own batch per GPU, whose peak on those lines the candidate also carries."""
    device, plan = base.report.device, base.report.device.plan
    fitted = fitted_lines(base)
    lines = rule.memory(Derivation(fitted.compute, fitted.step, base, gpus, cluster, states))
    notes = list(lines.notes)
    context_bytes = (device.context_bytes or 0) + _nccl_bytes(rule, device.kind, gpus,
                                                             lines.data_ranks)
    budget = (plan.usable_bytes - context_bytes) / fitted.reserve
    micro = min(lines.compute.largest_batch(budget), lines.step.largest_batch(budget),
                UNBOUNDED_BATCH)
    cap = host_offload_cap(base, cluster.gpus_per_node_for(gpus), micro)
    if cap is not None and cap < micro:
        micro = cap
        notes.append(f"batch limited to {cap} by host RAM for the offloaded activations")
    def peak_at(batch: int) -> int:
        return int(max(lines.compute.at(batch), lines.step.at(batch)) * fitted.reserve
                   + context_bytes)

    batching = _in_flight(accumulation(cluster.global_batch, micro, lines.data_ranks),
                          rule.micro_batches_in_flight(gpus), lines.data_ranks)
    notes += global_batch_note(batching, cluster.global_batch, lines.data_ranks)
    return scheduled_candidate(
        rule, base, gpus=gpus, data_ranks=lines.data_ranks, batching=batching,
        peak=peak_at(max(batching.micro, 1)), context=(cluster, gpu, states),
        method=_static_mark(base, rule.method(base)), notes=notes,
        job_batch_peak=None if job_batch is None else peak_at(job_batch))


def scheduled_candidate(rule: DerivedRule, base: TracedVariant, *, gpus: int, data_ranks: int,
                        batching: Batching, peak: int,
                        context: tuple[ClusterSpec, GpuSpec, ModelStates],
                        method: str, notes: list[str], job_batch_peak: int | None = None,
                        group: int = 1, exchange_s: float = 0.0) -> Candidate:
    """``rule``'s candidate on ``gpus`` GPUs at ``batching`` with ``peak`` bytes per GPU, its
    step timed on ``base``'s FLOPs: compute (with the rule's schedule over the micro-batches
    of a step) and what crosses the interconnect; labelled by the rule on ``base``.
    ``group``: GPUs of a context-parallel group, which share each sample's work (1: none);
    ``exchange_s``: seconds of the step's exchanges beyond the layout's own (its ring's)."""
    cluster, gpu, states = context
    device, steps = base.report.device, batching.steps
    micro = max(batching.micro, 1)
    # a base traced per GPU computes its share of the same samples on every GPU
    flops = base.flops_per_sample * micro * steps * (gpus if rule.traced_per_gpu else data_ranks)
    # each GPU launches every op of its steps (a pipeline stage: its share of them)
    launched = steps * (1 if rule.traced_per_gpu else data_ranks * group / gpus)
    compute_s = rule.compute_s(base.compute_seconds(flops / gpus, gpu, cluster.mfu, launched),
                               steps, gpus)
    bandwidth = bandwidth_bytes_per_s(cluster, gpus)
    halo_per_sample = device.halo_exchange_bytes / max(device.batch_size, 1)
    communication = (rule.communication_s(states, gpus, bandwidth)
                     + steps * 2 * halo_per_sample * micro / bandwidth
                     + steps * 2 * offloaded_at(device, micro) / HOST_LINK_BYTES_PER_S
                     + exchange_s + (rule.host_s(base, states, gpus) if rule.host_s else 0.0))
    name = rule.name(base.spec) + (f" + context-parallel×{group}" if group > 1 else "")
    label = name if base.rule.as_given else f"{name} + {base.label}"
    return _candidate(strategy=rule.strategy, label=label, gpus=gpus, method=method,
                      peak=peak, batching=batching,
                      timing=Timing(flops, compute_s, communication), notes=notes,
                      spatial_parts=base.spec.spatial_parts, job_batch_peak=job_batch_peak,
                      context_parallel=group)


def fewest_fitting_gpus(rule: DerivedRule, base: TracedVariant, states: ModelStates,
                        context: PlanContext) -> Sized:
    """On the GPUs given; with one GPU given, the fewest GPUs (powers of two up to
    ``max_gpus``) that fit; nothing when the cluster allows one GPU only."""
    cluster = context.cluster
    if cluster.gpus > 1:
        return distributed_candidate(rule, base, cluster.gpus, cluster, context.gpu, states,
                                     context.job_batch), None
    gpus, candidate = 2, None
    while gpus <= cluster.max_gpus:
        candidate = distributed_candidate(rule, base, gpus, cluster, context.gpu, states,
                                          context.job_batch)
        if candidate.fits or not rule.more_gpus_fit:
            return candidate, None
        gpus *= 2
    return candidate, None


def accumulation(global_batch: int | None, micro: int, ranks: int) -> Batching:
    """The micro-batch per GPU and accumulation steps for ``ranks`` data-parallel ranks whose
    largest micro-batch is ``micro``. With a global batch: the fewest steps whose equal
    micro-batches (at most ``micro``) make exactly that batch; where none can (``ranks`` does
    not divide it), the fewest steps at ``micro``, a global batch above the one asked (the
    candidate's note says so)."""
    if micro < 1:
        return Batching(micro, 1, 0)
    if global_batch is None:
        return Batching(micro, 1, micro * ranks)
    fewest = math.ceil(global_batch / (micro * ranks))
    if global_batch % ranks == 0:
        per_rank = global_batch // ranks
        steps = _smallest_divisor_from(per_rank, fewest)
        return Batching(per_rank // steps, steps, global_batch)
    return Batching(micro, fewest, fewest * micro * ranks)


def _smallest_divisor_from(number: int, least: int) -> int:
    """The smallest divisor of ``number`` that is at least ``least`` (``number`` itself at
    most)."""
    divisors = set()
    for low in range(1, math.isqrt(number) + 1):
        if number % low == 0:
            divisors.update((low, number // low))
    return min(divisor for divisor in divisors if divisor >= least)


def global_batch_note(batching: Batching, global_batch: int | None, ranks: int) -> list[str]:
    """Why a candidate's global batch is not the one asked, when it is not."""
    if global_batch is None or batching.global_batch in (0, global_batch):
        return []
    return [f"global batch {batching.global_batch}, not the {global_batch} asked: "
            f"{ranks} data-parallel ranks do not divide it into equal micro-batches"]


def _in_flight(batching: Batching, fewest_steps: int, ranks: int) -> Batching:
    """At least ``fewest_steps`` micro-batches per optimizer step, the global batch with them."""
    if batching.micro < 1 or batching.steps >= fewest_steps:
        return batching
    return Batching(batching.micro, fewest_steps, fewest_steps * batching.micro * ranks)


def _peak(model_bytes: int, per_sample: int, micro: int) -> int:
    return model_bytes + max(micro, 1) * per_sample


def _candidate(*, strategy: Strategy, label: str, gpus: int, method: str, peak: int,
               batching: Batching, timing: Timing, notes: list[str],
               spatial_parts: int = 1, job_batch_peak: int | None = None,
               context_parallel: int = 1) -> Candidate:
    step_time = timing.compute_s + timing.communication_s
    return Candidate(
        strategy=strategy, label=label, gpus=gpus, spatial_parts=spatial_parts,
        context_parallel=context_parallel, method=method,
        per_gpu_peak_bytes=peak, max_batch_size=batching.micro,
        accumulation_steps=batching.steps, global_batch_size=batching.global_batch,
        flops_per_step=timing.flops, compute_s=timing.compute_s,
        communication_s=timing.communication_s, step_time_s=step_time,
        samples_per_s=batching.global_batch / step_time if step_time else 0.0,
        fits=batching.micro >= 1, notes=notes, job_batch_peak_bytes=job_batch_peak)
