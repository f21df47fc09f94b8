"""One training step prepared for tracing: the model, its inputs and layout, and the reports
made so far, each batch traced once (``memcalc.pipeline`` builds it)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from memcalc.device.env_profile import resolve_profile
from memcalc.device.estimate import DeviceTarget, static_device_report, traced_device_report
from memcalc.device.gpus import find_gpu
from memcalc.device.replay_memo import ReplayMemo
from memcalc.device.report import DeviceReport, StaticEstimate
from memcalc.device.static import static_estimate
from memcalc.errors import TraceError
from memcalc.model.layout import LayoutDecision
from memcalc.model.user_hooks import user_hooks, without_user_hooks
from memcalc.specs import TrainingSpec
from memcalc.progress import announce
from memcalc.trace.step_line import StepLine
from memcalc.trace.tracer import StepSetup, TraceResult, trace_training_step


@dataclass
class PreparedStep:
    """Everything about the step that does not depend on the batch size, and the reports
    made so far: each batch traced once, its trace replayed for the target and, on demand,
    for other cards (``card_report``)."""

    target: DeviceTarget
    model: torch.nn.Module
    layout: LayoutDecision
    setup: StepSetup
    has_conv: bool
    leaf_output_elements: int | None
    sample_shape: tuple[int, ...]
    input_dtype_name: str
    layers: list
    table_error: str | None
    statics: dict[int, StaticEstimate] = field(default_factory=dict)
    reports: dict[int, DeviceReport] = field(default_factory=dict)
    output_shapes: dict[int, tuple[int, ...]] = field(default_factory=dict)
    trace_errors: dict[int, str] = field(default_factory=dict)
    traces: dict[int, TraceResult | None] = field(default_factory=dict)
    """Traced steps by batch (None where tracing failed)."""
    card_targets: dict[str, DeviceTarget] = field(default_factory=dict)
    card_reports: dict[tuple[str, int], DeviceReport] = field(default_factory=dict)
    hooks_left_out: str | None = None
    """Why the model's own hooks were left out of the traces (they failed on fakes)."""
    compile_left_out: str | None = None
    """Why the compiled step could not be traced (it was then traced eagerly)."""
    line: StepLine = field(default_factory=StepLine)
    """The line the traces lie on: once checked, batches on it are not traced."""
    line_traces: dict[int, TraceResult] = field(default_factory=dict)
    """Steps the line gave, by batch (not traced)."""
    tentative_line: bool = False
    """The line is used before a trace has checked it (a batch search, checked after)."""
    line_breaks: int = 0
    """Traces found off the line (what it gave was then forgotten)."""
    replays: ReplayMemo = field(default_factory=ReplayMemo)
    """The allocator's replays of the traces, for every card and limit asked."""

    @property
    def spec(self) -> TrainingSpec:
        return self.target.spec

    def static_at(self, batch_size: int) -> StaticEstimate:
        if batch_size not in self.statics:
            setup = self.setup
            self.statics[batch_size] = static_estimate(
                self.model, setup.inputs, batch_size, setup.policy, setup.optimizer,
                training=setup.evaluation is None)
        return self.statics[batch_size]

    def device_report(self, batch_size: int, real: bool = False) -> DeviceReport:
        """Traced once per batch size, or taken from the checked line of the traces
        (``real``: traced, whatever the line gives); static where tracing is known to fail."""
        if real and batch_size not in self.traces:
            self._forget_given(batch_size)
            self._trace(batch_size, real=True)
        if batch_size not in self.reports:
            self.reports[batch_size] = self._report(batch_size)
        return self.reports[batch_size]

    def from_line(self, batch_size: int) -> bool:
        """Whether the step at ``batch_size`` was taken from the line (not traced)."""
        return batch_size in self.line_traces and batch_size not in self.traces

    def costs_no_trace(self, batch_size: int) -> bool:
        return batch_size in self.traces or self.line.checked

    def trace_error_at(self, batch_size: int) -> str | None:
        """Why the report at ``batch_size`` is static (None when it is traced)."""
        if self.device_report(batch_size).method == "traced":
            return None
        return self.trace_errors.get(batch_size) or next(iter(self.trace_errors.values()))

    def _should_trace(self, batch_size: int) -> bool:
        """A model that failed at some batch is not traced again at that batch or below (a
        model that needs a larger batch, e.g. BatchNorm over a 1×1 map at batch 1, still
        traces above it), nor at all once it has failed twice without ever tracing."""
        if not self.trace_errors:
            return True
        traced_before = any(report.method == "traced" for report in self.reports.values())
        return ((traced_before or len(self.trace_errors) == 1)
                and all(batch_size > failed for failed in self.trace_errors))

    def card_report(self, card: str, batch_size: int) -> DeviceReport:
        """The step at ``batch_size`` on ``card`` (a catalog name), planned for its memory:
        the same trace, replayed for that card."""
        key = (card, batch_size)
        if key not in self.card_reports:
            self.card_reports[key] = self._report(batch_size, self.card_target(card))
        return self.card_reports[key]

    def card_target(self, card: str) -> DeviceTarget:
        if card not in self.card_targets:
            gpu = find_gpu(card)
            self.card_targets[card] = DeviceTarget(
                self.spec.with_changes(gpu=gpu.name), gpu,
                resolve_profile(self.spec.env_profile, gpu), gpu.memory_bytes,
                int(gpu.memory_bytes * self.spec.headroom_fraction))
        return self.card_targets[card]

    def _trace(self, batch_size: int, real: bool = False) -> TraceResult | None:
        if batch_size not in self.traces and not real:
            if batch_size not in self.line_traces:
                given = self.line.at(batch_size, self.tentative_line)
                if given is None:
                    return self._trace(batch_size, real=True)
                self.line_traces[batch_size] = given
                self.output_shapes[batch_size] = given.output_shape
            return self.line_traces[batch_size]
        if batch_size not in self.traces:
            self.traces[batch_size] = None
            if self._should_trace(batch_size):
                announce(f"tracing the step at batch {batch_size} ({len(self.traces) - 1} "
                         "traced so far)")
                setup = replace(self.setup,
                                batch_shape=(batch_size, *self.layout.traced_sample_shape))
                try:
                    trace = self._traced_compiled_or_eager(setup)
                    self.output_shapes[batch_size] = trace.output_shape
                    self.traces[batch_size] = trace
                    self._forget_given(batch_size)
                    if not self.line.observe(batch_size, trace):
                        self.line_breaks += 1
                        self._forget_given(*self.line_traces)
                except TraceError as error:
                    self.trace_errors[batch_size] = str(error)
        return self.traces[batch_size]

    def _forget_given(self, *batches: int) -> None:
        """Drop what the line gave at ``batches`` (a trace of theirs replaces it)."""
        for batch in batches:
            self.line_traces.pop(batch, None)
            self.reports.pop(batch, None)
            for key in [key for key in self.card_reports if key[1] == batch]:
                del self.card_reports[key]

    def _traced_compiled_or_eager(self, setup: StepSetup) -> TraceResult:
        """The step with its compiled regions; when that trace fails, eagerly, the reason
        among the compile fallbacks (and from then on eagerly)."""
        if not setup.compile_regions:
            return self._traced_with_or_without_hooks(setup)
        if self.compile_left_out is None:
            try:
                return self._traced_with_or_without_hooks(setup)
            except TraceError as error:
                self.compile_left_out = str(error)
        trace = self._traced_with_or_without_hooks(replace(setup, compile_regions=()))
        return replace(trace, compile_fallbacks=(
            f"(step): the compiled graphs failed where the eager step runs "
            f"({self.compile_left_out}): traced eager",))

    def _traced_with_or_without_hooks(self, setup: StepSetup) -> TraceResult:
        """The step with the model's own hooks; when it fails and the model has hooks, again
        without them (noted in ``hooks_left_out``), and from then on without them."""
        if self.hooks_left_out is not None:
            return trace_training_step(_hookless(setup))
        try:
            return trace_training_step(setup)
        except TraceError as error:
            if not user_hooks(self.model):
                raise
            trace = trace_training_step(_hookless(setup))
            self.hooks_left_out = str(error)
            return trace

    def _report(self, batch_size: int, target: DeviceTarget | None = None) -> DeviceReport:
        target = target or self.target
        trace = self._trace(batch_size)
        if trace is not None:
            return traced_device_report(target, batch_size, trace, self.replays)
        return static_device_report(
            target, self.static_at(batch_size), batch_size=batch_size,
            leaf_output_elements=self.leaf_output_elements,
            dtype=self.setup.policy.parameter_dtype, uses_conv=self.has_conv)


def _hookless(setup: StepSetup) -> StepSetup:
    copy_of_model = setup.build_meta_model
    return replace(setup, build_meta_model=lambda: without_user_hooks(copy_of_model()))
