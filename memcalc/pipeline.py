"""The pipeline: spec → model → layout → static count → traced steps → plan → report."""

from __future__ import annotations

import json
from dataclasses import replace
from enum import Enum
from functools import partial

import torch

from memcalc.device.allocator_settings import AllocatorSettings
from memcalc.device.batch_search import plan_batch_below
from memcalc.device.estimate import DeviceTarget
from memcalc.device.env_profile import resolve_profile
from memcalc.device.gpus import find_gpu
from memcalc.model.sliding_window import windowed
from memcalc.model.build import built_for_real, compiled_names
from memcalc.model.user_hooks import clear_traced_tensors
from memcalc.device.report import DeviceReport, StaticEstimate
from memcalc.device.static import layer_table
from memcalc.distributed.parallelize import job_tensor_layout
from memcalc.distributed.tensor_plan import NoTensorPlan
from memcalc.dtypes import INPUT_DTYPES
from memcalc.errors import InputError, TraceError
from memcalc.feed.sizing import HostInputs, host_and_throughput
from memcalc.host import WorkerMeasurement, detect_machine, measure_worker
from memcalc.host.specs import check_workers_within_cpus
from memcalc.host.workers import idle_workers_bytes
from memcalc.host.measure import Progress
from memcalc.model.inputs import ModelInputs, family_of
from memcalc.model.layout import CONV_TYPES, LayoutDecision
from memcalc.model.step_inputs import resolve_step_inputs, token_inputs
from memcalc.model.source import display_name, resolve_model
from memcalc.planned_batch import (batch_plan, card_fits_of, line_batches, reported_batch,
                                   window_plan)
from memcalc.prepared_step import PreparedStep
from memcalc.report.assumptions import (
    assumptions,
    attention_assumptions,
    bounded_size_assumptions,
    compiled_assumptions,
    skipped_workspace_assumptions,
    step_assumptions,
    step_unsupported,
)
from memcalc.report.models import InputSummary, ModelSummary, Report
from memcalc.specs import DeviceKind, LossKind, OptimizerImpl, StepPhase, TrainingSpec
from memcalc.trace.checkpointing import policy_blocks, repeated_blocks
from memcalc.trace.collector import fewer_collections
from memcalc.trace.flops import StepFlops
from memcalc.trace.halos import not_splittable_reason, slab_shape, split_axis
from memcalc.trace.optimizers import OptimizerRule, configured_rule
from memcalc.trace.precision import precision_policy
from memcalc.trace._torch_internals import (callers_torch_modes_set_aside,
                                            dtensor_caches_left_clean)
from memcalc.trace.compiled import eager_model
from memcalc.trace.tracer import StepSetup


class BatchSearch(str, Enum):
    """How far an estimate with a batch size and a capacity looks for the largest batch."""

    SEARCHED = "searched"
    """Searched by tracing (confirmed by the next batch up; a batch size given is reported)."""
    BELOW = "below"
    """Only where the batch given does not fit: about the largest batch that does, on the
    line through it and the smallest batch (one trace more; ``plan_batch_below``)."""
    NONE = "none"
    """Whether the batch given fits: one trace, ``device.plan`` None."""


def estimate(spec: TrainingSpec, progress: Progress | None = None, *,
             layer_tables: dict[str, tuple] | None = None, card_fits: bool = True,
             batch_search: BatchSearch = BatchSearch.SEARCHED) -> Report:
    """Estimate the memory of one training step described by ``spec``; plan the batch size
    when a GPU or a memory size is given; estimate host RAM and DataLoader workers.
    With ``spec.loader.dataset`` a real worker is measured first (``progress`` follows it).
    ``layer_tables``: torchinfo's tables kept across the estimates of one plan, which share
    them (see ``_layer_table``). ``batch_search``: with a batch size and a capacity, how far
    the largest batch is looked for (``BatchSearch``; without a batch size it is searched).
    ``card_fits``: without a GPU or memory size, also find the
    largest batch on the common cards (``memcalc.device.card_fit``: a second trace for the
    line, and up to ``CONFIRM_TRACES`` more to confirm); False leaves ``device.card_fits``
    empty."""
    with dtensor_caches_left_clean(), callers_torch_modes_set_aside():
        report = _estimate(spec, progress, layer_tables, card_fits, batch_search)
        validating = spec.validation_spec()
        if validating is None:
            return report
        idle = idle_workers_bytes(report.host) if report.host else 0
        validation = _estimate(validating, progress, layer_tables, card_fits=False,
                               batch_search=batch_search, resident_worker_bytes=idle)
        return report.model_copy(update={"validation": validation.device,
                                         "validation_host": validation.host})


def planner_estimate(spec: TrainingSpec, layer_tables: dict[str, tuple]) -> Report:
    """A report as the strategy planner asks for it, in its process or a worker: no
    common-card search (it reads each spec's own step); a spec with a batch size is that
    batch's own (one trace: a pipeline rank's microbatch trial, replayed at the card's
    capacity), one without has its batch planned."""
    return estimate(spec, layer_tables=layer_tables, card_fits=False,
                    batch_search=BatchSearch.SEARCHED if spec.batch_size is None
                    else BatchSearch.NONE)


def _estimate(spec: TrainingSpec, progress: Progress | None,
              layer_tables: dict[str, tuple] | None, card_fits: bool,
              batch_search: BatchSearch = BatchSearch.SEARCHED,
              resident_worker_bytes: int = 0) -> Report:
    if spec.machine is None:      # checked now, not after the trace, on the detected machine
        _workers_within_cpus(spec.loader, spec.machine_share(detect_machine()))
    measurement = (measure_worker(spec.loader, spec.batch_size or 1, progress=progress)
                   if spec.loader.dataset else None)
    with fewer_collections():
        prepared = _prepare(spec, measurement, layer_tables)
    try:
        searched = BatchSearch.SEARCHED if spec.batch_size is None else batch_search
        return _planned_report(spec, prepared, measurement,
                               card_fits and searched is BatchSearch.SEARCHED, progress,
                               resident_worker_bytes, layer_tables, batch_search=searched)
    finally:     # what the model's own hooks kept of the trace's tensors
        clear_traced_tensors(prepared.model)


def _planned_report(spec: TrainingSpec, prepared: PreparedStep,
                    measurement: WorkerMeasurement | None, card_fits: bool,
                    progress: Progress | None, resident_worker_bytes: int,
                    layer_tables: dict[str, tuple] | None, *,
                    batch_search: BatchSearch = BatchSearch.SEARCHED
                    ) -> Report:
    with fewer_collections():   # not while the host side measures: its workers inherit it
        device, batch_size = _planned_device(spec, prepared, card_fits, layer_tables,
                                             batch_search)
    static = prepared.static_at(batch_size)
    host, throughput = host_and_throughput(HostInputs(
        spec, prepared.sample_shape, prepared.input_dtype_name, static, device,
        prepared.target.gpu, measurement, resident_worker_bytes), progress)
    return _report(prepared, device, static, host, throughput)


def _planned_device(spec: TrainingSpec, prepared: PreparedStep, card_fits: bool,
                    layer_tables: dict[str, tuple] | None, batch_search: BatchSearch
                    ) -> tuple[DeviceReport, int]:
    """The device report at the batch reported, with its batch plan (or the common cards'
    largest batches), and that batch."""
    usable = prepared.target.usable_bytes
    step = spec.parallel.batch_step if spec.parallel else 1
    plan = (batch_plan(prepared, usable, step)
            if usable is not None and batch_search is BatchSearch.SEARCHED else None)
    # a static count reports no largest batch (its plan stays for the planner, marked static)
    batch_size = spec.batch_size or (reported_batch(plan, spec, step)
                                     if prepared.device_report(step).method == "traced"
                                     else step)
    breaks = prepared.line_breaks
    device = prepared.device_report(batch_size, real=True)
    if plan is not None and any(point.method == "line" for point in plan.points) \
            and prepared.line_breaks != breaks:   # the headline's trace is off the plan's line
        plan = batch_plan(prepared, usable, step)
    if batch_search is BatchSearch.BELOW and usable is not None and device.fits is False \
            and device.method == "traced":
        plan = plan_batch_below(prepared.device_report, usable, step, batch_size)
    windows = window_plan(prepared, device, partial(_report_at, layer_tables=layer_tables))
    if windows is not None:
        device = device.model_copy(update={"window_plan": windows})
    if plan is not None:
        device = device.model_copy(update={"plan": plan})
    elif (card_fits and step == 1 and spec.device is DeviceKind.CUDA
          and device.method == "traced" and line_batches(spec) is None):
        device = device.model_copy(update={"card_fits": card_fits_of(prepared)})
    return device, batch_size


def _report_at(spec: TrainingSpec, batch_size: int,
               layer_tables: dict[str, tuple] | None) -> DeviceReport:
    """The device report of a variant of the job at one batch (a trace, nothing else)."""
    prepared = _prepare(spec, None, layer_tables)
    try:
        return prepared.device_report(batch_size)
    finally:
        clear_traced_tensors(prepared.model)


def _workers_within_cpus(loader, machine) -> None:
    try:
        check_workers_within_cpus(loader, machine)
    except ValueError as error:
        raise InputError(str(error)) from None


def _report(prepared: PreparedStep, device: DeviceReport, static: StaticEstimate, host,
            throughput) -> Report:
    spec, layout, setup = prepared.spec, prepared.layout, prepared.setup
    blocks = setup.checkpoint_blocks
    return Report(
        spec=spec, gpu=prepared.target.gpu,
        model=_model_summary(spec, prepared.model, prepared.layers, setup.compile_regions),
        input=InputSummary(layout=layout.layout, layout_explanation=layout.explanation,
                           traced_batch_shape=(device.batch_size, *layout.traced_sample_shape),
                           dtype=str(setup.batch_dtype).removeprefix("torch."),
                           output_shape=prepared.output_shapes.get(device.batch_size),
                           named_inputs={t.name: f"{(device.batch_size, *t.sample_shape)} "
                                                 f"{str(t.dtype).removeprefix('torch.')}"
                                         for t in setup.named_inputs},
                           family=family_of(prepared.model)),
        static=static, device=device,
        assumptions=assumptions(spec, prepared.target.gpu, prepared.target.profile,
                                model_has_conv=prepared.has_conv,
                                foreach=setup.foreach, traced=device.method == "traced")
        + step_assumptions(spec, checkpoint_blocks=blocks,
                           traced_sample_shape=layout.traced_sample_shape,
                           halo_exchange_bytes=device.halo_exchange_bytes,
                           ring_exchange_bytes=device.ring_exchange_bytes,
                           offloaded_bytes=device.offloaded_bytes,
                           offloaded_state_bytes=device.offloaded_state_bytes,
                           tensor_layout=_tensor_layout(spec, prepared.model,
                                                        device.sequence_parallel_dropped))
        + prepared.line.assumptions([batch for batch in prepared.line_traces
                                     if prepared.from_line(batch)])
        + bounded_size_assumptions(device.bounded_sizes)
        + skipped_workspace_assumptions(device.skipped_workspace_bytes)
        + compiled_assumptions(setup.compile_regions, device.compile_fallbacks)
        + attention_assumptions(device.attention_backends, prepared.target.gpu)
        + ([f"the model's own hooks failed on the trace's fake tensors ({prepared.hooks_left_out}"
            "); the step was traced without them: what they keep is not counted"]
           if prepared.hooks_left_out else [])
        + (["the model's constructor computes with its own layers (a forward to probe its "
            "strides), which meta weights cannot: it was built for real on the CPU, then "
            "copied to meta"] if built_for_real(prepared.model) else []),
        unsupported=step_unsupported(spec, checkpoint_blocks=blocks,
                                     table_error=prepared.table_error,
                                     trace_error=prepared.trace_error_at(device.batch_size),
                                     leaf_outputs_counted=prepared.leaf_output_elements
                                     is not None,
                                     unmodelled_kernels=device.unmodelled_kernels),
        host=host, throughput=throughput,
    )


def _tensor_layout(spec: TrainingSpec, model: torch.nn.Module, dropped: str) -> str:
    """What tensor parallelism applied beyond its column/row-wise plan ("" without it);
    ``dropped``: why the trace went without sequence parallelism after all."""
    if spec.parallel is None or spec.parallel.tp == 1:
        return ""
    parallel = (spec.parallel.model_copy(update={"sequence_parallel": False}) if dropped
                else spec.parallel)
    try:
        layout = job_tensor_layout(model, parallel, repeated_blocks(model),
                                   spec.loss is LossKind.CROSS_ENTROPY)
    except NoTensorPlan:      # the trace refused it too, and says why
        return ""
    return layout.describe() if not dropped else ", ".join(filter(None, (
        f"no sequence parallel (asked for; {dropped})", layout.describe())))


def _prepare(spec: TrainingSpec, measurement: WorkerMeasurement | None,
             layer_tables: dict[str, tuple] | None = None) -> PreparedStep:
    gpu = find_gpu(spec.gpu) if spec.gpu else None
    if (gpu or spec.gpu_memory_bytes) and spec.device is not DeviceKind.CUDA:
        raise InputError("--gpu/--gpu-memory plan GPU memory; drop them or use --device cuda")
    profile = resolve_profile(spec.env_profile, gpu)
    AllocatorSettings.from_conf(spec.allocator_conf)  # a bad setting fails here, once
    capacity = spec.gpu_memory_bytes or (gpu.memory_bytes if gpu else None)
    headroom = int(capacity * spec.headroom_fraction) if capacity else 0
    source = resolve_model(spec.model, spec.model_args)
    model = eager_model(source.build_meta(), source.instance)
    measured_dtype = (measurement.sample_dtype if measurement
                      and measurement.sample_dtype in INPUT_DTYPES else None)
    inputs = resolve_step_inputs(
        spec, model, default_shape=(tuple(measurement.sample_shape) if measurement
                                    else source.default_shape),
        default_dtype=measured_dtype or source.default_input_dtype)
    layout, halo_axis = _spatial_split(spec, model, inputs.layout)
    inputs = replace(inputs, layout=layout)
    policy = precision_policy(spec.precision)
    model_inputs = inputs.model_inputs(policy.batch_dtype)
    positional = model_inputs.positional
    window, cuda = spec.evaluated_window, spec.device is DeviceKind.CUDA
    build = (windowed(source.copier(model), window, layout.traced_sample_shape, host_split=cuda)
             if window else source.copier(model))
    setup = StepSetup(build, (1, *layout.traced_sample_shape),
                      positional.dtype if positional else torch.float32, spec.loss,
                      classes_last=token_inputs(inputs),
                      optimizer=_optimizer(spec), foreach=_foreach(spec),
                      policy=policy, cuda_kernels=cuda, cpu_kernels=not cuda,
                      cuda_capability=gpu.compute_capability_tuple if gpu else None,
                      keep_zeroed_grads=not spec.zero_grad_to_none,
                      free_output=spec.free_output, clip_grad_norm=spec.clip_grad_norm,
                      softmax_saves_input=spec.softmax_saves_input,
                      checkpoint_blocks=tuple(policy_blocks(
                          spec.activation_checkpointing, repeated_blocks(model)))
                      if spec.activation_checkpointing else (),
                      checkpoint_policy=spec.activation_checkpointing or "full",
                      offload_activations=spec.offload_activations, halo_axis=halo_axis,
                      cudnn=profile.cudnn if spec.device is DeviceKind.CUDA else None,
                      cudnn_benchmark=spec.cudnn_benchmark, cudnn_tf32=spec.cudnn_tf32,
                      named_inputs=model_inputs.named, forward_kwargs=model_inputs.forward_kwargs,
                      positional_input=positional is not None,
                      boxes_per_image=spec.boxes_per_image, parallel=spec.parallel,
                      evaluation=spec.eval_grad_mode if spec.phase is StepPhase.EVAL else None,
                      optimizer_state_held=spec.eval_holds_optimizer_state,
                      host_tensors=bool(cuda and window and window.uses_host),
                      compile_regions=("",) if spec.compile else compiled_names(model))
    layers, leaf_output_elements, table_error = _layer_table(
        spec, model, inputs.model_inputs(), layer_tables)
    has_conv = any(isinstance(module, CONV_TYPES) for module in model.modules())
    return PreparedStep(DeviceTarget(spec, gpu, profile, capacity, headroom), model, layout, setup,
                     has_conv, leaf_output_elements, inputs.sample_shape, inputs.dtype_name,
                     layers, table_error)


def _layer_table(spec: TrainingSpec, model: torch.nn.Module, inputs: ModelInputs,
                 tables: dict[str, tuple] | None) -> tuple:
    """torchinfo's table, once per model and input within ``tables``: the strategy planner
    estimates many variants of one job (precision, checkpointing, parallelism) that share it.
    ``tables`` lives for one plan, so a model edited between calls is never read stale."""
    if tables is None:
        return layer_table(model, inputs)
    key = json.dumps([spec.model, spec.model_args, repr(inputs)], sort_keys=True, default=repr)
    if key not in tables:
        tables[key] = layer_table(model, inputs)
    return tables[key]


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
    """torch.optim's default is foreach on CUDA, for-loop on CPU (also for the host-side
    parameters of FSDP2's CPU offload); fused builds neither."""
    if spec.optimizer_impl is OptimizerImpl.DEFAULT:
        offloaded = spec.parallel is not None and spec.parallel.cpu_offload
        return spec.device is DeviceKind.CUDA and not offloaded
    return spec.optimizer_impl is OptimizerImpl.FOREACH


def _optimizer(spec: TrainingSpec) -> OptimizerRule:
    """The spec's optimizer with its weight decay, amsgrad and fused options."""
    return configured_rule(spec.optimizer, weight_decay=spec.weight_decay, amsgrad=spec.amsgrad,
                           fused=spec.optimizer_impl is OptimizerImpl.FUSED)


def _model_summary(spec: TrainingSpec, model: torch.nn.Module, layers,
                   compiled: tuple[str, ...]) -> ModelSummary:
    parameters = list(model.parameters())
    return ModelSummary(
        name=display_name(spec.model),
        parameter_count=sum(p.numel() for p in parameters),
        trainable_parameter_count=sum(p.numel() for p in parameters if p.requires_grad),
        buffer_element_count=sum(b.numel() for b in model.buffers()),
        layers=layers, compiled_modules=list(compiled))


def training_flops(spec: TrainingSpec, batch_size: int = 1) -> int:
    """FLOPs of one forward + loss + backward at ``batch_size``."""
    return training_step_flops(spec, batch_size).total


def training_step_flops(spec: TrainingSpec, batch_size: int = 1) -> StepFlops:
    """The same FLOPs with their convolution share, from the traced step at ``batch_size``;
    TraceError when the model cannot be traced."""
    prepared = _prepare(spec, None)
    flops = prepared.device_report(batch_size).flops
    if flops is None:
        raise TraceError(f"FLOPs could not be counted: {prepared.trace_error_at(batch_size)}")
    return flops
