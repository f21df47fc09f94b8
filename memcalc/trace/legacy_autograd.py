"""Autograd formulas of older torch releases that keep different tensors for backward.

The trace runs the installed torch's formulas. A training node on an older release keeps what
its own ``derivatives.yaml`` says; each difference here is a pure rewrite applied by
``LegacyAutogradMode`` when the spec asks for it.

Before torch 1.11, ``softmax`` and ``log_softmax`` saved their input as well as their output
(``derivatives.yaml``: ``_softmax_backward_data(grad, result, dim, self)``, pytorch issue
#49600); pytorch PR #65242, relanded as #66018 on 2021-10-01 after the 1.10 branch cut, made
them keep the output only. On an attention layer that is one extra ``S x S`` tensor per head.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode


class _SoftmaxKeepingInput(torch.autograd.Function):
    """softmax / log_softmax whose node keeps its input and its output, as torch < 1.11 did."""

    @staticmethod
    def forward(ctx, tensor, dim, log, half_to_float=False):
        result = (torch._log_softmax if log else torch._softmax)(tensor, dim, half_to_float)
        ctx.save_for_backward(tensor, result)
        ctx.dim, ctx.log = dim, log
        return result

    @staticmethod
    def backward(ctx, grad):
        tensor, result = ctx.saved_tensors
        formula = torch._log_softmax_backward_data if ctx.log else torch._softmax_backward_data
        return formula(grad, result, ctx.dim, tensor.dtype), None, None, None


def _keeping_input(log: bool) -> Callable:
    def rewrite(tensor, dim=None, _stacklevel=3, dtype=None):
        if isinstance(_stacklevel, torch.dtype):   # torch.softmax(input, dim, dtype)
            _stacklevel, dtype = 3, _stacklevel
        if dtype is not None:
            tensor = tensor.to(dtype)
        if dim is None:   # F.softmax's implicit dim, as torch picks it
            dim = F._get_softmax_dim("log_softmax" if log else "softmax", tensor.dim(), _stacklevel)
        if not (torch.is_grad_enabled() and tensor.requires_grad):
            return (torch.log_softmax if log else torch.softmax)(tensor, dim)
        return _SoftmaxKeepingInput.apply(tensor, dim, log)

    return rewrite


def _kernel_keeping_input(log: bool) -> Callable:
    """``torch._softmax(input, dim, half_to_float)``, as CUDA autocast's float16 path calls it."""

    def rewrite(tensor, dim, half_to_float):
        if not (torch.is_grad_enabled() and tensor.requires_grad):
            return (torch._log_softmax if log else torch._softmax)(tensor, dim, half_to_float)
        return _SoftmaxKeepingInput.apply(tensor, dim, log, half_to_float)

    return rewrite


_SOFTMAX_KEEPS_INPUT: dict[Callable, Callable] = {
    function: _keeping_input(log)
    for log, functions in ((False, (torch.softmax, F.softmax, torch.Tensor.softmax)),
                           (True, (torch.log_softmax, F.log_softmax, torch.Tensor.log_softmax)))
    for function in functions
} | {torch._softmax: _kernel_keeping_input(False), torch._log_softmax: _kernel_keeping_input(True)}


class LegacyAutogradMode(TorchFunctionMode):
    """Apply the older formulas the spec names to calls made while the mode is active."""

    def __init__(self, softmax_saves_input: bool):
        super().__init__()
        self._rewrites = dict(_SOFTMAX_KEEPS_INPUT) if softmax_saves_input else {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        rewrite = self._rewrites.get(func)
        if rewrite is not None:
            return rewrite(*args, **(kwargs or {}))
        return func(*args, **(kwargs or {}))
