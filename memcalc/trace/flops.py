"""FLOPs of one training step (forward, loss, backward; recomputation when checkpointed),
counted by PyTorch's ``FlopCounterMode`` during the traced step's first iteration: matmuls,
convolutions, attention."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from torch.utils.flop_counter import FlopCounterMode

_CONVOLUTION_OPS = ("convolution", "convolution_backward", "_convolution")


class StepFlops(BaseModel):
    """FLOPs of one iteration, and how many of them are convolutions (cuDNN runs fp32
    convolutions on TF32 tensor cores by default; matmuls stay fp32)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    total: int
    convolution: int

    @property
    def convolution_fraction(self) -> float:
        return self.convolution / self.total if self.total else 0.0


def step_flops_of(counter: FlopCounterMode) -> StepFlops:
    """What ``counter`` counted, with the convolutions' share."""
    per_op = counter.get_flop_counts().get("Global", {})
    convolution = sum(count for op, count in per_op.items()
                      if getattr(op, "__name__", str(op)).split(".")[0] in _CONVOLUTION_OPS)
    return StepFlops(total=int(counter.get_total_flops()), convolution=int(convolution))
