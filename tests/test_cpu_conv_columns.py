"""The im2col columns of ATen's slow CPU convolutions (``memcalc.trace.cpu_conv_columns``):
their size from the closed form, and a CPU trace of small-batch 3D and 2D convolutions
against the real step (profiler memory timeline)."""

import pytest
import torch
from torch import nn

from memcalc.pipeline import estimate
from memcalc.specs import TrainingSpec
from memcalc.trace._torch_internals import conv_backend_name
from memcalc.trace.cpu_conv_columns import columns_bytes
from memcalc.trace.workspaces import ConvGeometry
from tests.fixtures.cpu_truth import measure_spec_cpu_peak

FIXTURES = "tests.test_cpu_conv_columns"


def _geometry(stride: int, padding: int, dims: int = 3) -> ConvGeometry:
    return ConvGeometry((stride,) * dims, (padding,) * dims, (1,) * dims, False,
                        (0,) * dims, 1)


def test_columns_hold_every_input_channel_under_every_kernel_tap_at_every_output_position():
    x, weight = torch.empty(2, 8, 16, 16, 16), torch.empty(4, 8, 3, 3, 3)
    assert columns_bytes(x, weight, (8, 8, 8), _geometry(2, 1)) == 2 * 8 * 27 * 8 ** 3 * 4


def test_a_pointwise_kernel_unfolds_nothing_unless_it_strides_or_pads():
    x, weight = torch.empty(1, 8, 16, 16, 16), torch.empty(4, 8, 1, 1, 1)
    assert columns_bytes(x, weight, (16, 16, 16), _geometry(1, 0)) == 0
    assert columns_bytes(x, weight, (8, 8, 8), _geometry(2, 0)) == 8 * 8 ** 3 * 4


def test_batch_one_3d_volumes_take_atens_slow_kernel_on_the_cpu():
    weight, geometry = torch.empty(8, 8, 3, 3, 3), _geometry(1, 1)
    assert conv_backend_name(torch.empty(1, 8, 32, 32, 32), weight, None, geometry) == "Slow3d"
    assert conv_backend_name(torch.empty(2, 8, 32, 32, 32), weight, None, geometry) == "Mkldnn"


def conv3d_stack() -> nn.Module:
    return nn.Sequential(nn.Conv3d(1, 16, 3, padding=1), nn.ReLU(),
                         nn.Conv3d(16, 16, 3, padding=1), nn.ReLU(),
                         nn.Conv3d(16, 16, 1), nn.Flatten(), nn.Linear(16 * 24 ** 3, 2))


def conv2d_stack() -> nn.Module:
    # few channels at batch 1: ATen's own 2D kernel, not oneDNN's
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(8, 8, 5, stride=2, padding=2), nn.ReLU(),
                         nn.Flatten(), nn.Linear(8 * 16 * 16, 2))


@pytest.mark.parametrize("model, shape", [("conv3d_stack", (1, 24, 24, 24)),
                                          ("conv2d_stack", (3, 32, 32))])
def test_a_cpu_trace_of_slow_convolutions_meets_the_real_step(model, shape):
    spec = TrainingSpec(model=f"{FIXTURES}:{model}", sample_shape=shape, batch_size=1,
                        device="cpu")
    report = estimate(spec)
    truth = measure_spec_cpu_peak(spec, report.input.traced_batch_shape)
    assert report.device.breakdown.workspaces > 0    # the columns are there ...
    assert report.device.peak_bytes == pytest.approx(truth, rel=0.03)   # ... and right
