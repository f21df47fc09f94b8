"""The pipeline: spec → model → layout → static count → traced step → report."""

from __future__ import annotations

import torch

from memcalc.assumptions import assumptions, unsupported as unsupported_cuda_effects
from memcalc.cuda_allocator import replay
from memcalc.errors import InputError, TraceError
from memcalc.layout import CONV_TYPES, resolve_layout
from memcalc.model_source import resolve_model
from memcalc.optimizers import optimizer_rule
from memcalc.precision import precision_policy
from memcalc.report import (Breakdown, DeviceReport, InputSummary, ModelSummary,
                            ModuleActivation, Report, StaticEstimate)
from memcalc.specs import INPUT_DTYPES, DeviceKind, TrainingSpec
from memcalc.static import element_size, layer_table, static_estimate
from memcalc.tracing import StepSetup, TraceResult, trace_training_step

TOP_MODULES = 10


def estimate(spec: TrainingSpec) -> Report:
    """Estimate the memory of one training step described by ``spec``."""
    source = resolve_model(spec.model, spec.model_args)
    model = source.build_meta()
    sample_shape = spec.sample_shape or source.default_shape
    if sample_shape is None:
        raise InputError(f"model {spec.model!r} has no default sample shape; give --shape")
    dtype_name = spec.input_dtype or source.default_input_dtype or "float32"
    input_dtype = INPUT_DTYPES[dtype_name]
    layout = resolve_layout(model, sample_shape, spec.layout)
    if layout.layout == "token-ids" and input_dtype.is_floating_point:
        raise InputError(f"the first layer of {spec.model!r} is an embedding: token ids need "
                         f"an integer dtype, got --input-dtype {dtype_name}; use int64")
    policy, rule = precision_policy(spec.precision), optimizer_rule(spec.optimizer)
    batch_shape = (spec.batch_size, *layout.traced_sample_shape)
    batch_dtype = policy.batch_dtype(input_dtype)
    static = static_estimate(model, batch_shape, batch_dtype, policy, rule)
    layers, leaf_output_elements, table_error = layer_table(model, layout.traced_sample_shape,
                                                            input_dtype)
    unsupported = [f"per-layer table: torchinfo failed ({table_error})"] if table_error else []
    foreach = spec.device is DeviceKind.CUDA
    setup = StepSetup(source.build_meta, batch_shape, batch_dtype, spec.loss,
                      classes_last=not input_dtype.is_floating_point, optimizer=rule,
                      foreach=foreach, policy=policy)
    try:
        trace = trace_training_step(setup)
        device, output_shape = _traced_device_report(spec, trace), trace.output_shape
    except TraceError as error:
        device = _static_device_report(spec, static, leaf_output_elements, policy.parameter_dtype)
        unsupported.append(f"traced step: {error}; the device figure is a STATIC estimate "
                           "(model states, input, layer outputs once), not a trace")
        output_shape = None
    return Report(
        spec=spec, model=_model_summary(spec, model, layers),
        input=InputSummary(layout=layout.layout, layout_explanation=layout.explanation,
                           traced_batch_shape=batch_shape,
                           dtype=str(batch_dtype).removeprefix("torch."),
                           output_shape=output_shape),
        static=static, device=device,
        assumptions=assumptions(spec, model_has_conv=_has_conv(model), foreach=foreach,
                                traced=device.method == "traced"),
        unsupported=unsupported + unsupported_cuda_effects(spec),
    )


def _model_summary(spec: TrainingSpec, model: torch.nn.Module, layers) -> ModelSummary:
    parameters = list(model.parameters())
    return ModelSummary(
        name=spec.model,
        parameter_count=sum(p.numel() for p in parameters),
        trainable_parameter_count=sum(p.numel() for p in parameters if p.requires_grad),
        buffer_element_count=sum(b.numel() for b in model.buffers()),
        layers=layers,
    )


def _traced_device_report(spec: TrainingSpec, trace: TraceResult) -> DeviceReport:
    ledger = trace.ledger
    per_module = sorted(ledger.activation_bytes_by_module_at_peak().items(),
                        key=lambda item: (-item[1], item[0]))
    peak_record = ledger.peak_record()
    reserved = (replay(ledger.events).peak_reserved_bytes
                if spec.device is DeviceKind.CUDA else None)
    return DeviceReport(
        kind=spec.device.value,
        batch_size=spec.batch_size,
        method="traced",
        breakdown=Breakdown.from_categories(ledger.bytes_by_category_at_peak()),
        top_modules=[ModuleActivation(module=name, activation_bytes=nbytes)
                     for name, nbytes in per_module[:TOP_MODULES]],
        peak_phase=peak_record.phase.value if peak_record else None,
        peak_iteration=peak_record.iteration if peak_record else None,
        peak_reserved_bytes=reserved,
    )


def _static_device_report(spec: TrainingSpec, static: StaticEstimate,
                          leaf_output_elements: int | None, dtype: torch.dtype) -> DeviceReport:
    """Model states + input + every leaf layer's output once (a lower bound on activations)."""
    activations = (leaf_output_elements or 0) * spec.batch_size * element_size(dtype)
    return DeviceReport(
        kind=spec.device.value,
        batch_size=spec.batch_size,
        method="static",
        breakdown=Breakdown(
            parameters=static.parameter_bytes, buffers=static.buffer_bytes,
            input_batch=static.input_batch_bytes, gradients=static.gradient_bytes,
            optimizer_state=static.optimizer_state_bytes + static.optimizer_step_counter_bytes,
            activations=activations, temporaries=0,
        ),
        top_modules=[],
        peak_phase=None,
        peak_iteration=None,
    )


def _has_conv(model: torch.nn.Module) -> bool:
    return any(isinstance(m, CONV_TYPES) for m in model.modules())
