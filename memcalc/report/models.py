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


class InputSummary(BaseModel):
    """How the per-sample shape was read and what batch was traced."""

    model_config = _FROZEN

    layout: str
    layout_explanation: str
    traced_batch_shape: tuple[int, ...]
    dtype: str
    output_shape: tuple[int, ...] | None


class Report(BaseModel):
    """Everything one estimate found, with what it assumed and what it could not model."""

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

    def plot(self, path=None):
        """The four pictures in one matplotlib figure; a PNG when ``path`` is given."""
        from memcalc.render.plot import plot_report
        return plot_report(self, path)

    def _repr_html_(self) -> str:
        from memcalc.render.html import report_html
        return report_html(self)
