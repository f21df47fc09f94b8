"""A grid of single convolutions run forward and backward on the GPU, every cuDNN call's
workspace recorded: the data ``memcalc calibrate`` fits the workspace rules to.

The grid spans 2D and 3D; plain, strided, 1×1, stem-like, depthwise and transposed
kernels; channel counts from 16 to 512 and feature maps from small to large, in fp32 with
TF32 on and off, bf16 and fp16. It does not use the user's model, so rules fitted to it can
be checked against real models.
"""

from __future__ import annotations

import itertools

import torch

from memcalc.calibration.conv_recorder import ConvRecorder
from memcalc.trace.cudnn_workspace import MeasuredConv

# (name, kernel size, stride, groups: 1 plain or 0 depthwise, transposed)
_KERNELS = [
    ("3x3", 3, 1, 1, False), ("3x3s2", 3, 2, 1, False), ("1x1", 1, 1, 1, False),
    ("1x1s2", 1, 2, 1, False), ("7x7s2", 7, 2, 1, False), ("dw7x7", 7, 1, 0, False),
    ("up2x2", 2, 2, 1, True),
]
_SIZES = {2: [(16, 64, 56), (32, 128, 28), (8, 256, 14), (4, 32, 112), (2, 512, 7)],
          3: [(2, 32, 32), (2, 64, 16), (1, 128, 8), (2, 16, 48), (1, 256, 8)]}
# (dtype, tf32)
MATH_MODES = [(torch.float32, True), (torch.float32, False), (torch.bfloat16, True),
              (torch.float16, True)]


def grid_layers(dims: int):
    """(conv layer, input shape) pairs of the grid for 2D or 3D."""
    conv = {2: torch.nn.Conv2d, 3: torch.nn.Conv3d}[dims]
    transpose = {2: torch.nn.ConvTranspose2d, 3: torch.nn.ConvTranspose3d}[dims]
    for (name, kernel, stride, groups, transposed), (batch, channels, size) in itertools.product(
            _KERNELS, _SIZES[dims]):
        if name == "dw7x7" and dims == 3:
            continue
        out_channels = channels if groups == 0 or transposed else channels * stride
        layer = (transpose(channels, channels // 2, kernel, stride=stride) if transposed
                 else conv(channels, out_channels, kernel, stride=stride, padding=kernel // 2,
                           groups=channels if groups == 0 else 1, bias=False))
        yield layer, (batch, channels, *([size] * dims))


def measure_grid(benchmark: bool = False, dims_list=(2, 3),
                 modes=tuple(MATH_MODES)) -> list[MeasuredConv]:
    """Every grid convolution's forward and backward, in each math mode, recorded."""
    recorder = ConvRecorder()
    previous = (torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32)
    torch.backends.cudnn.benchmark = benchmark
    try:
        for dims in dims_list:
            for layer, shape in grid_layers(dims):
                for dtype, tf32 in modes:
                    torch.backends.cudnn.allow_tf32 = tf32
                    module = layer.to(device="cuda", dtype=dtype)
                    x = torch.randn(shape, device="cuda", dtype=dtype, requires_grad=True)
                    with recorder:
                        module(x).sum().backward()
                    del module, x
    finally:
        torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32 = previous
    return recorder.records
