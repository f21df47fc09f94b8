"""Optimizer options (weight decay, amsgrad, fused) against what torch.optim keeps."""

import pytest
import torch

from memcalc.errors import InputError
from memcalc.pipeline import estimate
from memcalc.specs import TrainingSpec
from memcalc.trace.optimizers import OptimizerOptions, configured_rule

SIDE = 512
PARAMETER_BYTES = SIDE * SIDE * 4     # one fp32 weight: 1 MiB, whole allocator blocks


def square_linear():
    """One bias-free Linear(512 -> 512): the step is dominated by the weight and its state."""
    return torch.nn.Linear(SIDE, SIDE, bias=False)


def _spec(**changes) -> TrainingSpec:
    return TrainingSpec(model="tests.test_optimizer_options:square_linear", sample_shape=(SIDE,),
                        loss="sum", optimizer="adam", batch_size=1, **changes)


def test_amsgrad_keeps_a_third_state_tensor():
    plain = estimate(_spec()).device.breakdown.optimizer_state
    amsgrad = estimate(_spec(amsgrad=True)).device.breakdown.optimizer_state
    # torch.optim.Adam(amsgrad=True) adds state["max_exp_avg_sq"], shaped like the parameter
    assert amsgrad - plain == PARAMETER_BYTES
    assert configured_rule("adam", amsgrad=True).state_copies == 3


def test_fused_adam_holds_no_parameter_sized_temporary():
    fused = estimate(_spec(optimizer_impl="fused", weight_decay=1e-4)).device
    looped = estimate(_spec(optimizer_impl="for-loop", weight_decay=1e-4)).device
    # weight, gradient, exp_avg, exp_avg_sq: 4 parameter-sized tensors. fused_adam_impl.cu
    # updates them in place; the for-loop adds grad + wd * param and the sqrt denominator.
    assert fused.peak_bytes < looped.peak_bytes
    assert looped.peak_bytes - fused.peak_bytes >= PARAMETER_BYTES


def test_fused_builds_torch_fused_optimizer_and_refuses_where_cuda_has_none():
    rule = configured_rule("adamw", weight_decay=0.01, fused=True)
    optimizer = rule.build([torch.nn.Parameter(torch.ones(4))], True)
    assert optimizer.defaults["fused"] and not optimizer.defaults["foreach"]
    assert optimizer.defaults["weight_decay"] == 0.01
    with pytest.raises(InputError, match="fused"):
        configured_rule("rmsprop", fused=True)
    with pytest.raises(InputError, match="amsgrad"):
        configured_rule("sgd", amsgrad=True)
    assert OptimizerOptions() == configured_rule("adam").options
