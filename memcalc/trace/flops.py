"""FLOPs of one training step (forward, loss, backward; recomputation when checkpointed),
counted by PyTorch's ``FlopCounterMode`` on fake tensors: matmuls, convolutions, attention."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.flop_counter import FlopCounterMode

from memcalc.trace._torch_internals import fake_cpu_mode
from memcalc.trace.losses import compute_loss, make_target, primary_output
from memcalc.trace.precision import cpu_autocast
from memcalc.trace.halos import ZeroHalos
from memcalc.trace.tracer import StepSetup, step_model


_CONVOLUTION_OPS = ("convolution", "convolution_backward", "_convolution")


@dataclass(frozen=True)
class StepFlops:
    """FLOPs of one iteration, and how many of them are convolutions (cuDNN runs fp32
    convolutions on TF32 tensor cores by default; matmuls stay fp32)."""

    total: int
    convolution: int

    @property
    def convolution_fraction(self) -> float:
        return self.convolution / self.total if self.total else 0.0


def step_flops(setup: StepSetup) -> StepFlops:
    """FLOPs of one iteration at ``setup.batch_shape`` (the optimizer step is not counted)."""
    with fake_cpu_mode():
        model = step_model(setup, ZeroHalos())
        batch = torch.empty(setup.batch_shape, dtype=setup.batch_dtype)
        autocast = cpu_autocast(setup.policy.autocast_dtype)
        with FlopCounterMode(display=False) as counter:
            with autocast:
                output = primary_output(model(batch))
                target = make_target(setup.loss, output, setup.classes_last)
                loss = compute_loss(setup.loss, output, target, setup.classes_last)
            loss.backward()
    per_op = counter.get_flop_counts().get("Global", {})
    convolution = sum(count for op, count in per_op.items()
                      if getattr(op, "__name__", str(op)).split(".")[0] in _CONVOLUTION_OPS)
    return StepFlops(int(counter.get_total_flops()), int(convolution))
