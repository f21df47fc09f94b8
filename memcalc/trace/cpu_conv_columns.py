"""The im2col columns PyTorch's own CPU convolutions allocate, put into the traced event
sequence where a CPU step allocates them.

A fake trace runs a convolution's meta kernel, which makes its outputs only. On a CPU,
ATen picks the kernel (``_select_conv_backend``): oneDNN for most convolutions, but its
own ``slow_conv3d`` / ``_slow_conv2d`` for small batches (batch 1 of a small 3D volume, as
3D U-Nets run). Those unfold the whole batch into a columns buffer, ``N × (C_in·k…) ×
out_spatial`` elements, alive while the op runs (``ConvolutionMM3d.cpp``,
``ConvolutionMM2d.cpp``; measured with the profiler, torch 2.13):
- forward: the columns beside the output;
- backward, 3D: the input gradient and its own columns, then the weight gradient and
  the input's columns again; 2D: both gradients, then one columns buffer;
- a 1×1 kernel with stride 1 and no padding unfolds nothing.

Known limitations: the slow dilated and transposed kernels' own buffers are not modelled,
and are named when the step calls them; oneDNN's scratchpads are not modelled.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from memcalc.trace._torch_internals import conv_backend_name
from memcalc.trace.workspaces import ConvGeometry

_UNFOLDING = {"Slow3d": 2, "Slow2d": 1}
"""ATen backend → columns buffers its backward allocates one after the other."""
_UNMODELLED = {"SlowDilated2d", "SlowDilated3d", "SlowTranspose2d", "SlowTranspose3d"}


def columns_bytes(x: torch.Tensor, weight: torch.Tensor, out_spatial: tuple[int, ...],
                  geometry: ConvGeometry) -> int:
    """Bytes of the columns buffer a slow CPU convolution unfolds ``x`` into (0 when a 1×1
    kernel with stride 1 and no padding needs none)."""
    kernel = tuple(weight.shape[2:])
    if (all(size == 1 for size in kernel) and all(step == 1 for step in geometry.stride)
            and not any(geometry.padding)):
        return 0
    return (x.shape[0] * x.shape[1] * math.prod(kernel) * math.prod(out_spatial)
            * x.element_size())


class CpuConvColumns:
    """Op hook for ``StorageWatcher`` on a CPU target: watches a slow convolution's outputs
    in ATen's order and adds its columns as transient allocations."""

    def __init__(self, transient: Callable[[int], None]) -> None:
        self._transient = transient
        self.unmodelled: set[str] = set()

    def __call__(self, name: str, args: tuple, outputs, watch: Callable) -> bool:
        """Handle one op; False when it is not a slow convolution (the watcher goes on)."""
        if name == "convolution":
            x, weight = args[:2]
            geometry = ConvGeometry.of_forward(args)
            backend = self._backend(x, weight, geometry)
            if backend not in _UNFOLDING:
                return False
            watch(outputs)
            self._transient(columns_bytes(x, weight, tuple(outputs.shape[2:]), geometry))
            return True
        if name != "convolution_backward":
            return False
        grad_output, x, weight = args[:3]
        geometry = ConvGeometry.of_backward(args)
        backend = self._backend(x, weight, geometry)
        if backend not in _UNFOLDING:
            return False
        columns = columns_bytes(x, weight, tuple(grad_output.shape[2:]), geometry)
        grad_input, grad_weight, grad_bias = outputs
        if _UNFOLDING[backend] == 1:
            watch(outputs)
            self._transient(columns)
            return True
        for grad in (grad_input, grad_weight):
            if grad is not None:
                watch(grad)
                self._transient(columns)
        if grad_bias is not None:
            watch(grad_bias)
        return True

    def _backend(self, x, weight, geometry: ConvGeometry) -> str:
        backend = conv_backend_name(x, weight, None, geometry)
        if backend in _UNMODELLED:
            self.unmodelled.add(f"CPU convolution {backend}: its own columns buffers are not "
                                "modelled")
        return backend
