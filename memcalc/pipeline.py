"""The pipeline: spec → model → layout → static count → traced steps → plan → report."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from memcalc.report.assumptions import assumptions
from memcalc.report.assumptions import unsupported as unsupported_cuda_effects
from memcalc.trace.checkpointing import repeated_blocks
from memcalc.device.allocator_settings import AllocatorSettings
from memcalc.device.estimate import static_device_report, traced_device_report
from memcalc.device.env_profile import EnvProfile, resolve_profile
from memcalc.errors import InputError, TraceError
from memcalc.trace.flops import StepFlops, step_flops
from memcalc.device.gpus import GpuSpec, find_gpu
from memcalc.host import WorkerMeasurement, measure_worker
from memcalc.host.measure import Progress
from memcalc.feed.sizing import host_and_throughput
from memcalc.model.layout import CONV_TYPES, LayoutDecision, resolve_layout
from memcalc.model.source import display_name, resolve_model
from memcalc.trace.optimizers import optimizer_rule
from memcalc.device.batch_search import PlanPoint, plan_batch
from memcalc.trace.precision import precision_policy
from memcalc.report.models import (
    DeviceReport,
    InputSummary,
    ModelSummary,
    Report,
    StaticEstimate,
)
from memcalc.trace.halos import not_splittable_reason, slab_shape, split_axis
from memcalc.specs import INPUT_DTYPES, DeviceKind, OptimizerImpl, TrainingSpec
from memcalc.device.static import layer_table, static_estimate
from memcalc.trace.tracer import StepSetup, trace_training_step
from memcalc.units import format_bytes


@dataclass
class _Prepared:
    """Everything about the step that does not depend on the batch size."""

    spec: TrainingSpec
    gpu: GpuSpec | None
    profile: EnvProfile
    usable_bytes: int | None
    """Capacity minus headroom (None when no GPU or memory size is given)."""
    model: torch.nn.Module
    layout: LayoutDecision
    setup: StepSetup
    has_conv: bool
    leaf_output_elements: int | None
    sample_shape: tuple[int, ...]
    input_dtype_name: str
    reports: dict[int, DeviceReport] = field(default_factory=dict)
    output_shapes: dict[int, tuple[int, ...]] = field(default_factory=dict)
    trace_error: str | None = None

    def static_at(self, batch_size: int) -> StaticEstimate:
        setup = self.setup
        return static_estimate(self.model, (batch_size, *self.layout.traced_sample_shape),
                               setup.batch_dtype, setup.policy, setup.optimizer)

    def device_report(self, batch_size: int) -> DeviceReport:
        """Traced once per batch size; static for every batch once a trace has failed."""
        if batch_size not in self.reports:
            self.reports[batch_size] = self._report(batch_size)
        return self.reports[batch_size]

    def flops_at(self, batch_size: int) -> StepFlops:
        """FLOPs of one forward + loss + backward (recomputation included when checkpointing);
        TraceError when the model cannot run on fake tensors."""
        setup = replace(self.setup, batch_shape=(batch_size, *self.layout.traced_sample_shape))
        try:
            return step_flops(setup)
        except Exception as error:   # the user's model may raise anything on fake tensors
            raise TraceError(f"FLOPs could not be counted: {type(error).__name__}: "
                             f"{error}") from error

    def _report(self, batch_size: int) -> DeviceReport:
        if self.trace_error is None:
            setup = replace(self.setup, batch_shape=(batch_size, *self.layout.traced_sample_shape))
            try:
                trace = trace_training_step(setup)
                self.output_shapes[batch_size] = trace.output_shape
                return traced_device_report(self.spec, batch_size, trace, self.gpu,
                                            self.profile, self.usable_bytes)
            except TraceError as error:
                self.trace_error = str(error)
        return static_device_report(self.spec, batch_size, self.static_at(batch_size),
                                    self.leaf_output_elements, self.setup.policy.parameter_dtype,
                                    self.has_conv, self.profile)


def estimate(spec: TrainingSpec, progress: Progress | None = None) -> Report:
    """Estimate the memory of one training step described by ``spec``; plan the batch size
    when a GPU or a memory size is given; estimate host RAM and DataLoader workers.
    With ``spec.loader.dataset`` a real worker is measured first (``progress`` follows it)."""
    measurement = (measure_worker(spec.loader, spec.batch_size or 1, progress=progress)
                   if spec.loader.dataset else None)
    prepared, layers, table_error = _prepare(spec, measurement)
    capacity = spec.gpu_memory_bytes or (prepared.gpu.memory_bytes if prepared.gpu else None)
    headroom = int(capacity * spec.headroom_fraction) if capacity else 0
    plan = (plan_batch(lambda b: prepared.device_report(b).total_bytes, capacity - headroom,
                       lambda b: prepared.device_report(b).fits)
            if capacity else None)
    if plan is not None:
        plan = plan.model_copy(update={"points": [_with_phases(point, prepared.device_report(
            point.batch_size)) for point in plan.points]})
    batch_size = spec.batch_size or (plan.max_batch_size if plan and plan.max_batch_size else 1)
    device = prepared.device_report(batch_size).model_copy(
        update=dict(capacity_bytes=capacity, headroom_bytes=headroom, plan=plan))

    unsupported = [f"per-layer table: torchinfo failed ({table_error})"] if table_error else []
    blocks = prepared.setup.checkpoint_blocks
    if spec.activation_checkpointing and not blocks:
        unsupported.append("activation checkpointing: no repeated blocks found, not applied")
    extra_assumptions = ([f"activation checkpointing (non-reentrant) of {len(blocks)} repeated "
                          f"blocks: {blocks[0]} … {blocks[-1]}"] if blocks else [])
    if spec.spatial_parts > 1:
        extra_assumptions.append(
            f"spatial parallelism over {spec.spatial_parts} GPUs: this GPU runs one slab of "
            f"every sample (input {prepared.layout.traced_sample_shape}), its padded convolutions "
            f"and pools receive halo rows from both neighbours ({format_bytes(device.halo_exchange_bytes)} "
            "per iteration); weights replicated, their gradients all-reduced (buckets not "
            "counted here)")
    if spec.offload_activations:
        extra_assumptions.append(
            f"activations offloaded as save_on_cpu does: every saved tensor copied to pinned "
            f"host memory ({format_bytes(device.offloaded_bytes)} per iteration) and back in "
            "backward; the copies' time is not modelled")
    if prepared.trace_error:
        unsupported.append(f"traced step: {prepared.trace_error}; the device figure is a STATIC "
                           "estimate (model states, input, layer outputs once), not a trace")
    layout, setup = prepared.layout, prepared.setup
    static = prepared.static_at(batch_size)
    host, throughput = host_and_throughput(
        spec, prepared.sample_shape, prepared.input_dtype_name, batch_size, static, device,
        prepared.gpu, prepared.flops_at, measurement, progress)
    return Report(
        spec=spec, gpu=prepared.gpu, model=_model_summary(spec, prepared.model, layers),
        input=InputSummary(layout=layout.layout, layout_explanation=layout.explanation,
                           traced_batch_shape=(batch_size, *layout.traced_sample_shape),
                           dtype=str(setup.batch_dtype).removeprefix("torch."),
                           output_shape=prepared.output_shapes.get(batch_size)),
        static=static, device=device,
        assumptions=assumptions(spec, prepared.gpu, prepared.profile,
                                model_has_conv=prepared.has_conv,
                                foreach=setup.foreach, traced=device.method == "traced")
        + extra_assumptions,
        unsupported=unsupported + unsupported_cuda_effects(spec), host=host,
        throughput=throughput,
    )


def _with_phases(point: PlanPoint, device: DeviceReport) -> PlanPoint:
    return point.model_copy(update={
        "allocated_bytes": device.peak_allocated_bytes,
        "compute_peak_bytes": device.compute_peak_bytes,
        "optimizer_peak_bytes": device.optimizer_peak_bytes})


def _prepare(spec: TrainingSpec, measurement: WorkerMeasurement | None
             ) -> tuple[_Prepared, list, str | None]:
    gpu = find_gpu(spec.gpu) if spec.gpu else None
    if (gpu or spec.gpu_memory_bytes) and spec.device is not DeviceKind.CUDA:
        raise InputError("--gpu/--gpu-memory plan GPU memory; drop them or use --device cuda")
    profile = resolve_profile(spec.env_profile, gpu)
    AllocatorSettings.from_conf(spec.allocator_conf)  # a bad setting fails here, once
    capacity = spec.gpu_memory_bytes or (gpu.memory_bytes if gpu else None)
    usable = capacity - int(capacity * spec.headroom_fraction) if capacity else None
    source = resolve_model(spec.model, spec.model_args)
    model = source.build_meta()
    measured_shape = tuple(measurement.sample_shape) if measurement else None
    sample_shape = spec.sample_shape or measured_shape or source.default_shape
    if sample_shape is None:
        raise InputError(f"model {spec.model!r} has no default sample shape; give --shape "
                         "or --dataset")
    measured_dtype = (measurement.sample_dtype if measurement
                      and measurement.sample_dtype in INPUT_DTYPES else None)
    dtype_name = spec.input_dtype or measured_dtype or source.default_input_dtype or "float32"
    input_dtype = INPUT_DTYPES[dtype_name]
    layout, halo_axis = _spatial_split(spec, model, resolve_layout(model, sample_shape,
                                                                  spec.layout))
    if layout.layout == "token-ids" and input_dtype.is_floating_point:
        raise InputError(f"the first layer of {spec.model!r} is an embedding: token ids need "
                         f"an integer dtype, got --input-dtype {dtype_name}; use int64")
    policy = precision_policy(spec.precision)
    setup = StepSetup(source.build_meta, (1, *layout.traced_sample_shape),
                      policy.batch_dtype(input_dtype), spec.loss,
                      classes_last=not input_dtype.is_floating_point,
                      optimizer=optimizer_rule(spec.optimizer), foreach=_foreach(spec),
                      policy=policy, cuda_kernels=spec.device is DeviceKind.CUDA,
                      keep_zeroed_grads=not spec.zero_grad_to_none,
                      checkpoint_blocks=tuple(repeated_blocks(model))
                      if spec.activation_checkpointing else (),
                      offload_activations=spec.offload_activations, halo_axis=halo_axis,
                      cudnn=profile.cudnn if spec.device is DeviceKind.CUDA else None,
                      cudnn_benchmark=spec.cudnn_benchmark, cudnn_tf32=spec.cudnn_tf32)
    layers, leaf_output_elements, table_error = layer_table(model, layout.traced_sample_shape,
                                                            input_dtype)
    has_conv = any(isinstance(module, CONV_TYPES) for module in model.modules())
    prepared = _Prepared(spec, gpu, profile, usable, model, layout, setup, has_conv,
                         leaf_output_elements, sample_shape, dtype_name)
    return prepared, layers, table_error


def _spatial_split(spec: TrainingSpec, model: torch.nn.Module,
                   layout: LayoutDecision) -> tuple[LayoutDecision, int | None]:
    """With ``spec.spatial_parts`` > 1: one GPU's slab as the traced shape, and the batch
    axis whose convolutions exchange halos."""
    parts, full = spec.spatial_parts, layout.traced_sample_shape
    if parts == 1:
        return layout, None
    reason = not_splittable_reason(model, full)
    if reason:
        raise InputError(f"--spatial-parts {parts}: {spec.model!r} cannot be split spatially: "
                         f"{reason}; drop --spatial-parts")
    axis = split_axis(full)
    if parts > full[axis]:
        raise InputError(f"--spatial-parts {parts} is more than the {full[axis]} positions of "
                         f"the longest spatial axis of {full}; use at most {full[axis]}")
    slab = slab_shape(full, parts)
    explanation = (f"{layout.explanation}; one of {parts} GPUs' slabs of every sample: axis "
                   f"{axis} of {full} split {full[axis]} → {slab[axis]}")
    return replace(layout, traced_sample_shape=slab, explanation=explanation), 1 + axis


def _foreach(spec: TrainingSpec) -> bool:
    """torch.optim's default is foreach on CUDA, for-loop on CPU; fused is traced as for-loop."""
    if spec.optimizer_impl is OptimizerImpl.DEFAULT:
        return spec.device is DeviceKind.CUDA
    return spec.optimizer_impl is OptimizerImpl.FOREACH


def _model_summary(spec: TrainingSpec, model: torch.nn.Module, layers) -> ModelSummary:
    parameters = list(model.parameters())
    return ModelSummary(
        name=display_name(spec.model),
        parameter_count=sum(p.numel() for p in parameters),
        trainable_parameter_count=sum(p.numel() for p in parameters if p.requires_grad),
        buffer_element_count=sum(b.numel() for b in model.buffers()),
        layers=layers,
    )


def training_flops(spec: TrainingSpec, batch_size: int = 1) -> int:
    """FLOPs of one forward + loss + backward at ``batch_size`` (``_Prepared.flops_at``)."""
    return training_step_flops(spec, batch_size).total


def training_step_flops(spec: TrainingSpec, batch_size: int = 1) -> StepFlops:
    """The same FLOPs with their convolution share."""
    return _prepare(spec, None)[0].flops_at(batch_size)
