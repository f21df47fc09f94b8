"""The kernels a traced step launches, in order: what each one computes and moves, for the
step-time model (``memcalc.device.kernel_time``).

A kernel here is one launched ATen op (a view or a bare allocation launches none): its class
(which engine and rate it runs at), whether it computes in half precision, its FLOPs from
torch's formulas and the bytes of every tensor it reads or writes (inputs plus outputs, each
counted once per op; an in-place op reads and writes the same bytes).

Known limitations: an op that launches several kernels (a convolution's backward: one for the
input's gradient, one for the weight's; a foreach op: one per chunk of tensors) is one entry;
caches do not count (bytes are what the op touches, each once).
"""

from __future__ import annotations

from enum import Enum
from typing import NamedTuple


class KernelClass(str, Enum):
    """Which engine a kernel runs on, and so which peak rate bounds it."""

    CONV2D = "conv2d"
    """cuDNN convolutions of 1D and 2D images (and their backward)."""
    CONV3D = "conv3d"
    """cuDNN convolutions of volumes: far below the peak that 2D convolutions reach."""
    MATMUL = "matmul"
    """cuBLAS matrix products (mm, addmm, bmm, baddbmm, linear)."""
    ATTENTION = "attention"
    """Fused attention (scaled dot product attention's kernels)."""
    DEPTHWISE = "depthwise"
    """Convolutions with one input channel per group (depthwise, or a one-channel image):
    few FLOPs per byte, no tensor cores, and far below the bandwidth."""
    MEMORY = "memory"
    """Everything else: element-wise ops, reductions, norms, copies, the optimizer's foreach
    ops; bounded by memory bandwidth."""


class Kernel(NamedTuple):
    """One launched op: its class, its half precision ("bf16", "fp16"; "" for none), FLOPs
    and bytes touched, and whether it grows with the batch (forward, loss and backward) or
    not (the optimizer's step)."""

    kind: KernelClass
    half: str
    flops: int
    bytes: int
    batched: bool = True


_CONVOLUTION_OPS = frozenset({"convolution", "convolution_backward", "_convolution",
                              "cudnn_convolution", "mkldnn_convolution"})
_MATMUL_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "_grouped_mm",
                         "_scaled_mm", "addbmm"})


def kernel_class(op_name: str, operand_dims: int | None = None,
                 channels_per_group: int | None = None) -> KernelClass:
    """The class of ATen op ``op_name``; for a convolution, ``operand_dims``: the dimensions
    of its second tensor (its weight forward, its input backward: 5 for a volume) and
    ``channels_per_group``: its weight's input channels."""
    if op_name in _CONVOLUTION_OPS:
        if channels_per_group == 1:
            return KernelClass.DEPTHWISE
        return KernelClass.CONV3D if (operand_dims or 0) >= 5 else KernelClass.CONV2D
    if op_name in _MATMUL_OPS:
        return KernelClass.MATMUL
    if "attention" in op_name or "flash" in op_name:
        return KernelClass.ATTENTION
    return KernelClass.MEMORY
