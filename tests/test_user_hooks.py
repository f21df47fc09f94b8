"""The user's own hooks on a model handed to memcalc: run by the trace, never left holding
memcalc's tensors, and left out (said so) only when they fail on fake tensors."""

import torch
from torch import nn

import memcalc


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8))


def test_a_hook_that_keeps_activations_runs_but_keeps_none_of_memcalcs_tensors():
    model, kept, calls = _model(), [], []

    class Recorder:
        def __init__(self):
            self.seen = {}

        def __call__(self, module, inputs, output):
            self.seen[len(self.seen)] = output

    recorder = Recorder()
    def keep(module, inputs, output):
        calls.append(1)
        kept.append(output)

    model[0].register_forward_hook(keep)
    model[2].register_forward_hook(recorder)
    real = torch.randn(2, 8)
    kept.append(real)                                   # the user's own entry stays
    report = memcalc.estimate(model, (32,), device="cpu", batch_size=4)
    assert report.device.method == "traced" and calls    # the hook ran in the trace
    assert kept == [real] and recorder.seen == {}
    assert not any("own hooks failed" in line for line in report.assumptions)


def test_a_hook_that_reads_values_is_left_out_of_the_trace_and_said_so():
    model, means = _model(), []

    def log_mean(module, inputs, output):
        means.append(float(output.detach().numpy().mean()))

    model[0].register_forward_hook(log_mean)
    report = memcalc.estimate(model, (32,), device="cpu", batch_size=4)
    assert report.device.method == "traced"
    assert any("own hooks failed" in line and ".numpy()" in line
               for line in report.assumptions)
    assert len(model[0]._forward_hooks) == 1             # the user's model keeps its hook
    model(torch.randn(2, 32))                            # and still runs it for real
    assert len(means) == 1
