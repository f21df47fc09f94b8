"""What an estimate found. Quantities are integer bytes; totals are computed, not stored."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from memcalc.feed.model import ThroughputReport
from memcalc.device.gpus import GpuSpec
from memcalc.host.report import HostReport
from memcalc.device.report import DeviceReport, LayerRow, StaticEstimate
from memcalc.specs import TrainingSpec

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class ModelSummary(BaseModel):
    model_config = _FROZEN

    name: str
    parameter_count: int
    trainable_parameter_count: int
    buffer_element_count: int
    layers: list[LayerRow]
    compiled_modules: list[str] = []
    """Modules traced as ``torch.compile`` runs them (``""``: the whole model)."""


class InputSummary(BaseModel):
    """How the per-sample shape was read and what batch was traced."""

    model_config = _FROZEN

    layout: str
    layout_explanation: str
    traced_batch_shape: tuple[int, ...]
    dtype: str
    output_shape: tuple[int, ...] | None
    named_inputs: dict[str, str] = {}
    """Named tensors of ``forward`` as traced: name → ``(batch, ...) dtype``."""
    family: str = "tensors"
    """How the model was called (``tensors``, ``detection``, ``encoder-decoder``)."""


TRACE_FAILED_PREFIX = "traced step: "
"""Starts the ``unsupported`` line that says why an estimate is static."""


class Report(BaseModel):
    """Everything one estimate found, with what it assumed and what it could not model.

    Rendering lives above this module: ``memcalc.render`` (terminal, HTML, ``memcalc.plot``)
    and ``memcalc.notebook``, which shows reports as HTML in IPython.
    """

    model_config = _FROZEN

    spec: TrainingSpec
    gpu: GpuSpec | None
    model: ModelSummary
    input: InputSummary
    static: StaticEstimate
    device: DeviceReport
    assumptions: list[str]
    unsupported: list[str]
    throughput: ThroughputReport | None = None
    """Whether the DataLoader keeps the GPU busy; None without a step and a sample time."""
    host: HostReport | None = None
    """Host RAM of the training process and the DataLoader worker counts that fit."""
    validation: DeviceReport | None = None
    """The job's validation step (``spec.eval_sample_shape``) with the optimizer's state
    resident: its peak joins the verdict; None when the job has none."""
    validation_host: HostReport | None = None
    """Host RAM while the job validates: the validation loader's workers and whole volumes,
    what the validation step keeps on the CPU, and the training loader's persistent
    workers; None when the job has no validation step."""

    @property
    def trace_failure(self) -> str:
        """Why the step could not be traced, from its ``unsupported`` lines ("" where none
        says)."""
        return next((line.removeprefix(TRACE_FAILED_PREFIX).split(";")[0]
                     for line in self.unsupported if line.startswith(TRACE_FAILED_PREFIX)), "")
