"""FLOPs of one training step (forward, loss, backward; recomputation when checkpointed),
counted with PyTorch's flop formulas during the traced step's first iteration: matmuls,
convolutions, attention."""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field, SkipValidation

from memcalc.trace.kernels import Kernel

_CONVOLUTION_OPS = ("convolution", "convolution_backward", "_convolution")


class StepFlops(BaseModel):
    """FLOPs of one iteration, and how many of them are convolutions (cuDNN runs fp32
    convolutions on TF32 tensor cores by default; matmuls stay fp32)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    total: int
    convolution: int
    launched_ops: int = 0
    """ATen ops that launch work in forward, loss and backward (0: not counted)."""
    kernels: SkipValidation[tuple[Kernel, ...]] = Field(default=(), exclude=True, repr=False)
    """Every op launched in order, the optimizer's step included, for the step-time model
    (not serialised: a report read back from JSON has none, and is timed from its FLOPs)."""

    @property
    def convolution_fraction(self) -> float:
        return self.convolution / self.total if self.total else 0.0


def step_flops_of(by_op: Mapping[str, int], launched_ops: int = 0,
                  kernels: tuple[Kernel, ...] = ()) -> StepFlops:
    """FLOPs counted per ATen op name, with the convolutions' share; the ops launched beside
    them, and the kernels in order."""
    convolution = sum(count for op, count in by_op.items() if op in _CONVOLUTION_OPS)
    return StepFlops(total=int(sum(by_op.values())), convolution=int(convolution),
                     launched_ops=launched_ops, kernels=kernels)
