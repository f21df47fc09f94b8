"""The evaluation step's settings: which step is traced, how its forward runs, and
sliding-window inference over whole volumes (MONAI's ``sliding_window_inference``)."""

from __future__ import annotations

from enum import Enum

from pydantic import BaseModel, ConfigDict, Field, field_validator


class StepPhase(str, Enum):
    """Which step of the job is traced."""

    TRAIN = "train"
    """Forward, loss, backward, optimizer step, ``zero_grad``."""
    EVAL = "eval"
    """Validation or inference: ``model.eval()``, forward and loss under ``GradMode``; no
    gradients and no optimizer state."""


class GradMode(str, Enum):
    """How an evaluation step runs its forward."""

    NO_GRAD = "no_grad"
    """``torch.no_grad()``: nothing is saved for backward."""
    INFERENCE_MODE = "inference_mode"
    """``torch.inference_mode()``: as no_grad, without version counters."""
    ENABLED = "enabled"
    """Neither: autograd saves what backward would need (a validation loop that forgot
    ``no_grad``), freed when the output and loss are dropped."""


class WindowMode(str, Enum):
    """How MONAI weights a window's output where windows overlap."""

    CONSTANT = "constant"
    GAUSSIAN = "gaussian"


class BufferDevice(str, Enum):
    """Where a sliding window keeps a whole-volume tensor."""

    GPU = "gpu"
    CPU = "cpu"
    """Host RAM: MONAI moves each window to the GPU (``sw_device``) and back."""


class SlidingWindowSpec(BaseModel):
    """Whole volumes evaluated window by window, as ``monai.inferers.sliding_window_inference``
    does: the sample shape is the whole volume, the windows run the model ``sw_batch_size`` at
    a time on the GPU, and the output and count map of the whole volume are aggregated where
    ``output_device`` says (MONAI's ``device``; by default the volume's)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    roi: tuple[int, ...]
    """The window's spatial size (``roi_size``), e.g. (128, 128, 128)."""
    sw_batch_size: int = Field(default=1, ge=1)
    overlap: float = Field(default=0.25, ge=0.0, lt=1.0)
    mode: WindowMode = WindowMode.CONSTANT
    volume_device: BufferDevice = BufferDevice.GPU
    """Where the whole volume lives (MONAI's ``inputs``); ``cpu``: in host RAM, each window
    batch copied to the GPU (``sw_device="cuda"``)."""
    output_device: BufferDevice | None = None
    """Where the output and count map are aggregated (MONAI's ``device``); None: the
    volume's device, MONAI's default."""

    @property
    def aggregated_on(self) -> BufferDevice:
        return self.output_device or self.volume_device

    @property
    def uses_host(self) -> bool:
        """The volume or the aggregation lives in host RAM."""
        return BufferDevice.CPU in (self.volume_device, self.aggregated_on)

    @field_validator("roi")
    @classmethod
    def _positive(cls, roi: tuple[int, ...]) -> tuple[int, ...]:
        if not roi or any(size <= 0 for size in roi):
            raise ValueError(f"the window (--roi) needs positive sizes: got {roi}")
        return roi
