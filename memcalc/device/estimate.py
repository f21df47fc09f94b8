"""One device report at one batch size: from a trace (plus CUDA effects) or, failing that, static."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from memcalc.device.allocator_settings import AllocatorSettings
from memcalc.device.cuda_overheads import context_bytes, job_nccl_bytes, workspace_allocations
from memcalc.device.env_profile import EnvProfile
from memcalc.device.gpus import GpuSpec
from memcalc.device.replay_memo import ReplayMemo
from memcalc.device.report import (
    BoundedSize,
    Breakdown,
    DeviceReport,
    ModuleActivation,
    StaticEstimate,
    TimelinePoint,
)
from memcalc.dtypes import element_size
from memcalc.specs import DeviceKind, TrainingSpec
from memcalc.trace.context_parallel import ring_exchange_bytes
from memcalc.trace.cuda_autocast_audit import left_at_cpu_policy
from memcalc.trace.precision import precision_policy
from memcalc.trace.reported_ops import CONV_OPS, CUBLAS_OPS
from memcalc.trace.tracer import TraceResult

TOP_MODULES = 10


@dataclass(frozen=True)
class DeviceTarget:
    """The device an estimate is for: the job, the card (if named), its environment profile
    and the memory planned for."""

    spec: TrainingSpec
    gpu: GpuSpec | None
    profile: EnvProfile
    capacity_bytes: int | None = None
    """``--gpu-memory`` or the card's memory; None when neither is given."""
    headroom_bytes: int = 0

    @property
    def driver_reserved_bytes(self) -> int:
        """What the driver keeps of a CUDA card's total from every process (the profile's;
        0 elsewhere)."""
        return self.profile.driver_reserved_bytes if self.spec.device is DeviceKind.CUDA else 0

    @property
    def usable_bytes(self) -> int | None:
        """Capacity minus headroom and what the driver keeps: what a step's total (its
        nvidia-smi figure) may reach."""
        if self.capacity_bytes is None:
            return None
        return max(0, self.capacity_bytes - self.headroom_bytes - self.driver_reserved_bytes)


def traced_device_report(target: DeviceTarget, batch_size: int, trace: TraceResult,
                         replays: ReplayMemo | None = None) -> DeviceReport:
    """Breakdown at the traced peak; on CUDA also reserved memory, workspaces and context,
    and with a capacity whether the step runs in capacity minus headroom; where it does not
    run (or with no capacity), the least memory it runs in (which also steers the batch
    search near the capacity). ``replays``: the step's replays made so far (for other cards,
    other batches' searches), each made once."""
    replays = replays or ReplayMemo()
    spec, gpu, profile, usable_bytes = target.spec, target.gpu, target.profile, target.usable_bytes
    ledger = trace.ledger
    cuda_fields = {}
    if spec.device is DeviceKind.CUDA:
        uses_matmul = bool(trace.op_names & CUBLAS_OPS)
        workspaces = workspace_allocations(profile, gpu, uses_matmul)
        settings = AllocatorSettings.from_conf(spec.allocator_conf)
        context = context_bytes(profile, spec.cuda_module_loading, uses_matmul=uses_matmul,
                                uses_conv=bool(trace.op_names & CONV_OPS)) \
            + job_nccl_bytes(spec.parallel)
        limited = None
        if usable_bytes is not None:
            outside = context   # the driver's reserve is out of the usable bytes already
            limited = replays.at_limit(ledger.events, workspaces, settings,
                                       max(0, usable_bytes - outside))
        # Where the limit is reached, the allocator frees its cache and retries: what the
        # card then holds is the limited replay's peak; when the step does not run in it, the
        # least limit it runs in (the smallest card's need); without a limit, the peak it
        # reaches with room enough.
        runs = limited.fits if limited is not None else None
        reserved, least = limited, None
        if not runs:
            failed = 0 if limited is None else max(0, usable_bytes - outside)
            least = replays.least(ledger.events, workspaces, settings, failed)
            reserved = least if limited is not None else replays.at_limit(
                ledger.events, workspaces, settings, None)
        cuda_fields = dict(
            peak_reserved_bytes=reserved.peak_reserved_bytes,
            least_reserved_bytes=(least.peak_reserved_bytes
                                  if least is not None and limited is None else None),
            workspace_bytes=sum(workspaces), context_bytes=context,
            cudnn_calls=trace.cudnn_calls, env_profile=profile.name, runs_at_capacity=runs,
            skipped_workspace_bytes=reserved.skipped_optional_bytes)
        # one replay decides every figure: the breakdown, modules and timeline leave out the
        # workspaces it could not place (cuDNN then runs a plan that needs less)
        ledger = ledger.without(reserved.skipped_records)
    per_module = sorted(ledger.activation_bytes_by_module_at_peak().items(),
                        key=lambda item: (-item[1], item[0]))
    peak_record = ledger.peak_record()
    compute_peak, optimizer_peak = ledger.phase_peaks()
    return DeviceReport(
        kind=spec.device.value,
        batch_size=batch_size,
        method="traced",
        breakdown=Breakdown.from_categories(ledger.bytes_by_category_at_peak()),
        top_modules=[ModuleActivation(module=name, activation_bytes=nbytes)
                     for name, nbytes in per_module[:TOP_MODULES]],
        peak_phase=peak_record.phase.value if peak_record else None,
        compute_peak_bytes=compute_peak, optimizer_peak_bytes=optimizer_peak,
        offloaded_bytes=trace.offloaded_bytes, halo_exchange_bytes=trace.halo_bytes,
        offloaded_state_bytes=trace.offloaded_state_bytes,
        ring_exchange_bytes=(ring_exchange_bytes(trace.ring_bytes, spec.parallel.cp)
                             if spec.parallel else 0),
        host_tensor_bytes=trace.host_bytes, compile_fallbacks=list(trace.compile_fallbacks),
        sequence_parallel_dropped=trace.sequence_parallel_dropped,
        stage_peak_bytes=list(trace.stage_peak_bytes),
        timeline=[TimelinePoint(event=event, live_bytes=live, phase=phase, iteration=iteration)
                  for event, live, phase, iteration in ledger.timeline()],
        peak_iteration=peak_record.iteration if peak_record else None,
        flops=trace.flops, capacity_bytes=target.capacity_bytes,
        bounded_sizes=[BoundedSize(op=use.op, bound=use.bound, count=use.count,
                                   keeps_most_work=use.keeps_most_work)
                       for use in trace.bounded_sizes],
        headroom_bytes=target.headroom_bytes, driver_reserved_bytes=target.driver_reserved_bytes,
        attention_backends=trace.attention_backends,
        unmodelled_kernels=list(trace.unmodelled_kernels) + _autocast_left_alone(spec, trace),
        **cuda_fields,
    )


def _autocast_left_alone(spec: TrainingSpec, trace: TraceResult) -> list[str]:
    if spec.device is not DeviceKind.CUDA or precision_policy(spec.precision).autocast_dtype is None:
        return []
    return [f"CUDA autocast: {name} ran in float32 as CPU autocast runs it; CUDA autocast does "
            "not list it (memcalc.trace.cuda_autocast_audit)"
            for name in left_at_cpu_policy(trace.op_names)]


def static_device_report(target: DeviceTarget, static: StaticEstimate, *, batch_size: int,
                         leaf_output_elements: int | None, dtype: torch.dtype,
                         uses_conv: bool) -> DeviceReport:
    """Model states + input + every leaf layer's output once (a lower bound on activations).

    ``static`` is counted at ``batch_size``; the leaf outputs are per sample.
    """
    spec, profile = target.spec, target.profile
    activations = (leaf_output_elements or 0) * batch_size * element_size(dtype)
    on_cuda = spec.device is DeviceKind.CUDA
    breakdown = Breakdown(
        parameters=static.parameter_bytes, buffers=static.buffer_bytes,
        input_batch=static.input_batch_bytes, gradients=static.gradient_bytes,
        optimizer_state=static.optimizer_state_bytes + static.optimizer_step_counter_bytes,
        activations=activations, temporaries=0,
    )
    return DeviceReport(
        kind=spec.device.value,
        batch_size=batch_size,
        method="static",
        breakdown=breakdown,
        # the same lower bound split by phase: activations live in forward/backward only
        compute_peak_bytes=breakdown.total_bytes,
        optimizer_peak_bytes=breakdown.total_bytes - activations,
        top_modules=[],
        peak_phase=None,
        peak_iteration=None,
        context_bytes=(context_bytes(profile, spec.cuda_module_loading, uses_matmul=True,
                                     uses_conv=uses_conv) + job_nccl_bytes(spec.parallel)
                       if on_cuda else 0),
        env_profile=profile.name if on_cuda else None,
        capacity_bytes=target.capacity_bytes, headroom_bytes=target.headroom_bytes,
        driver_reserved_bytes=target.driver_reserved_bytes,
    )
