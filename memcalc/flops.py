"""FLOPs of one training step (forward, loss, backward; recomputation when checkpointed),
counted by PyTorch's ``FlopCounterMode`` on fake tensors: matmuls, convolutions, attention."""

from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode

from memcalc._torch_internals import fake_cpu_mode
from memcalc.losses import compute_loss, make_target, primary_output
from memcalc.precision import cpu_autocast
from memcalc.spatial import ZeroHalos
from memcalc.tracing import StepSetup, step_model


def step_flops(setup: StepSetup) -> int:
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
    return int(counter.get_total_flops())
