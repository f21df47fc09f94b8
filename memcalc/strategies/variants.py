"""Single-GPU variants of a job, traced on their own, and the estimator that traces them.

The planner does not trace by itself: the caller injects a ``VariantEstimator`` (``memcalc.api``
builds one on ``memcalc.pipeline``), so this package stays below the pipeline.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from memcalc.device.gpus import GpuSpec
from memcalc.device.speed import timed_step
from memcalc.errors import TraceError
from memcalc.specs import Precision, TrainingSpec

if TYPE_CHECKING:
    from torch import nn

    from memcalc.report.models import Report
    from memcalc.strategies.rules import TracedRule
    from memcalc.strategies.specs import Strategy
    from memcalc.trace.flops import StepFlops


def _nothing_ahead(specs: list[TrainingSpec], sure: bool = True) -> None:
    return None


@dataclass(frozen=True)
class VariantEstimator:
    """What the planner needs from the estimator: a report per spec (its batch planned when
    the spec has a capacity), the FLOPs of a training step, and the model built on the meta
    device (for its repeated blocks and whether a sample can be split spatially).

    ``prefetch`` may make the reports of specs the planner is about to ask for ahead (in
    other processes), so that ``report`` then finds them; the planner asks for them in the
    same order either way, so what it builds does not depend on it. ``sure``: it asks for
    every one (else it may skip all but the first)."""

    report: Callable[[TrainingSpec], Report]
    flops: Callable[[TrainingSpec, int], StepFlops]
    model: Callable[[TrainingSpec], nn.Module]
    prefetch: Callable[..., None] = _nothing_ahead


@dataclass(frozen=True)
class TracedVariant:
    """One single-GPU configuration, traced and planned."""

    rule: TracedRule
    spec: TrainingSpec
    report: Report
    flops_per_sample: float
    step: StepFlops | None = None
    """The traced step's FLOPs and kernels (None: not counted)."""

    def compute_seconds(self, flops: float, gpu: GpuSpec, mfu: float | None,
                        launched_steps: float = 1.0) -> float:
        """Seconds of ``launched_steps`` launches of this variant's step computing ``flops``
        in all on ``gpu``: kernel by kernel, or at ``mfu`` when given
        (``memcalc.device.speed.timed_step``)."""
        return timed_step(self.step, flops, gpu, self.spec.precision, self.spec.cudnn_tf32,
                          mfu, launched_steps).seconds

    @property
    def strategy(self) -> Strategy:
        """The strategy its rule traces."""
        return self.rule.strategy

    @property
    def label(self) -> str:
        """Its name in candidates' labels and in the plan."""
        return self.rule.strategy.value


def planned_spec(spec: TrainingSpec) -> TrainingSpec:
    """The spec whose report a variant is traced and planned from: its batch left to plan."""
    return spec.with_changes(batch_size=None)


def traced_variant(rule: TracedRule, spec: TrainingSpec,
                   estimator: VariantEstimator) -> TracedVariant:
    """``spec`` traced and planned under ``rule``; a step whose FLOPs cannot be counted is
    timed at zero FLOPs rather than dropped (its memory is still known)."""
    report = estimator.report(planned_spec(spec))
    device = report.device
    if device.flops is not None and device.batch_size:   # counted in the trace that ran
        return TracedVariant(rule, spec, report, device.flops.total / device.batch_size,
                             device.flops)
    try:
        flops = estimator.flops(spec, 1)
    except TraceError:
        return TracedVariant(rule, spec, report, 0.0)
    return TracedVariant(rule, spec, report, float(flops.total), flops)


def mixed_precision_for(gpu: GpuSpec) -> Precision:
    """bf16 autocast where the card has bf16 tensor cores (Ampere on), else fp16."""
    return Precision.BF16_MIXED if gpu.bf16_tflops else Precision.FP16_MIXED
