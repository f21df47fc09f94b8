"""The ATen ops whose presence in a trace a report reads, by the name the trace lists them
under (``TraceResult.op_names``: the op's overload packet).

A device report asks whether a step runs matmuls (cuBLAS's workspace and library memory),
convolutions (cuDNN's) and ops left at CPU autocast's policy (named in the assumptions); no
other op name changes a figure. Two traces of one step that differ only in other names (an
op path taken at one batch alone, as FSDP2's ZeRO-2 gradients take ``empty_strided`` at
batch 1) differ in nothing shown: ``memcalc.trace.affine_trace`` draws its line through them.
"""

from __future__ import annotations

from collections.abc import Iterable

from memcalc.trace.cuda_autocast_audit import LEFT_AT_CPU_POLICY

CUBLAS_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "addbmm", "_addmm_activation"})
"""Ops that run on cuBLAS on CUDA (linear layers, attention's math path, bmm)."""
CONV_OPS = frozenset({"convolution", "_convolution", "mkldnn_convolution", "convolution_backward",
                      "_slow_conv2d_forward", "slow_conv3d_forward", "cudnn_convolution"})
"""Convolution ops as the CPU trace names them; on CUDA each runs through cuDNN."""
REPORTED_OPS = CUBLAS_OPS | CONV_OPS | LEFT_AT_CPU_POLICY


def reported_ops(op_names: Iterable[str]) -> frozenset[str]:
    """The names among ``op_names`` that a report reads."""
    return REPORTED_OPS.intersection(op_names)
