"""isolate=True: the estimate runs in a child process; crashes and hangs become one-line
errors instead of killing the caller."""

import pytest
from torch import nn

import memcalc
from memcalc.errors import InputError, TraceError

MACHINE = {"cpus": 2, "ram_bytes": 4 << 30}


def test_isolated_estimate_equals_the_in_process_one():
    options = dict(batch_size=4, device="cpu", model_args={"in_features": 16, "hidden": 32},
                   machine=MACHINE)
    isolated = memcalc.estimate("mlp", (16,), isolate=True, timeout_s=120, **options)
    assert isolated.device.peak_bytes == memcalc.estimate("mlp", (16,), **options).device.peak_bytes


def test_a_crashing_model_does_not_take_the_caller_down():
    with pytest.raises(TraceError, match=r"crashed \(exit code -11\)"):
        memcalc.estimate("tests.fixtures.models:crashing", (8,), batch_size=2, isolate=True,
                         timeout_s=120, machine=MACHINE)


def test_a_hanging_model_is_stopped_at_the_timeout():
    with pytest.raises(TraceError, match=r"did not finish in 8 s"):
        memcalc.estimate("tests.fixtures.models:hanging", (8,), batch_size=2, isolate=True,
                         timeout_s=8, machine=MACHINE)


def test_instances_cannot_be_isolated():
    with pytest.raises(InputError, match="isolate=True needs a model name"):
        memcalc.estimate(nn.Linear(4, 2), (4,), isolate=True)
