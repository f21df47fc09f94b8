"""RMSNorm as CUDA runs it: torch's fused kernel keeps its input and one float per row.

``aten/src/ATen/native/layer_norm.cpp`` (``rms_norm_symint``): ``F.rms_norm`` (and
``nn.RMSNorm``) calls ``_fused_rms_norm`` whenever the weight's dtype is the input's and the
input is neither channels-last nor complex. On CUDA that is one kernel
(``native/cuda/layer_norm_kernel.cu``) writing the output and ``rstd`` (float32, one per
normalized row), and ``derivatives.yaml`` saves ``input``, ``weight`` and ``rstd`` for
``_fused_rms_norm_backward``, which writes the input's and the weight's gradients. The CPU
wheel has no kernel for it and decomposes it into float32 steps: a float32 copy of the input
and the normalized float32 tensor are saved for backward, 8 bytes per element beside a
bfloat16 input's 2 (a LLaMA block without checkpointing: two norms over its residual stream).

The rewrite keeps CUDA's tensors: it writes the output and ``rstd`` (on fake tensors, which
have no values, nothing else; on real ones the values come from the decomposition, whose
scratch is freed before the rewrite returns) and saves what the fused backward reads. Torch
releases without ``_fused_rms_norm`` run the decomposition on CUDA too, and are left alone.

Known limitations: the backward kernel's float32 partial sums for the weight's gradient (a
few rows of ``dim`` per thread block) are not modelled; a DTensor's norm (tensor parallel's
``SequenceParallel``) runs as before, decomposed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from memcalc.trace._torch_internals import is_fake_tensor

FUSED = hasattr(torch.ops.aten, "_fused_rms_norm")
"""The installed torch routes ``rms_norm`` to the fused kernel (on CUDA, one kernel)."""


def _normalized_dims(normalized_shape: int | Sequence[int]) -> int:
    return 1 if isinstance(normalized_shape, int) else len(normalized_shape)


def _decomposed(input, normalized_shape, weight, eps) -> tuple[torch.Tensor, torch.Tensor]:
    """The output and ``rstd``, computed step by step (real tensors only)."""
    dims = tuple(range(-_normalized_dims(normalized_shape), 0))
    wide = input.float()
    eps = torch.finfo(torch.float32).eps if eps is None else eps   # torch's, for half inputs too
    rstd = torch.rsqrt(wide.pow(2).mean(dims, keepdim=True) + eps)
    normalized = wide * rstd
    return (normalized if weight is None else normalized * weight).to(input.dtype), rstd


class _FusedRmsNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, weight, normalized_shape, eps):
        if is_fake_tensor(input):   # what the kernel writes; a fake tensor holds no values
            rows = input.shape[:input.dim() - _normalized_dims(normalized_shape)]
            output = torch.empty_like(input)
            rstd = input.new_empty((*rows, *[1] * _normalized_dims(normalized_shape)),
                                   dtype=torch.float32)
        else:
            with torch.no_grad():
                output, rstd = _decomposed(input, normalized_shape, weight, eps)
        ctx.save_for_backward(input, weight, rstd)
        ctx.normalized_shape, ctx.eps = normalized_shape, eps
        return output

    @staticmethod
    def backward(ctx, grad):
        input, weight, rstd = ctx.saved_tensors
        if is_fake_tensor(input):
            grad_input = torch.empty_like(input) if ctx.needs_input_grad[0] else None
            grad_weight = (torch.empty_like(weight) if weight is not None
                           and ctx.needs_input_grad[1] else None)
            return grad_input, grad_weight, None, None
        with torch.enable_grad():
            leaf = input.detach().requires_grad_()
            leaf_weight = weight.detach().requires_grad_() if weight is not None else None
            output, _ = _decomposed(leaf, ctx.normalized_shape, leaf_weight, ctx.eps)
        inputs = [leaf] + ([leaf_weight] if leaf_weight is not None else [])
        grads = torch.autograd.grad(output, inputs, grad)
        return grads[0], (grads[1] if weight is not None else None), None, None


def _plain(tensor: torch.Tensor) -> bool:
    """A tensor of the trace, not a subclass (a DTensor's norm runs as DTensor runs it)."""
    return type(tensor) in (torch.Tensor, torch.nn.Parameter) or is_fake_tensor(tensor)


def _channels_last(tensor: torch.Tensor) -> bool:
    """Laid out channels-last (``suggest_memory_format``: the decomposition runs)."""
    layout = {4: torch.channels_last, 5: torch.channels_last_3d}.get(tensor.dim())
    return (layout is not None and not tensor.is_contiguous()
            and tensor.is_contiguous(memory_format=layout))


def fused_rms_norm(input, normalized_shape, weight=None, eps=None) -> torch.Tensor:
    """``F.rms_norm`` as a CUDA build runs it: the fused kernel where ``rms_norm_symint``
    takes it, else the decomposition (``F.rms_norm`` itself)."""
    fused = (FUSED and _plain(input) and not input.is_complex()
             and (weight is None or (_plain(weight) and weight.dtype == input.dtype))
             and not _channels_last(input))
    if not fused:
        return F.rms_norm(input, normalized_shape, weight, eps)
    return _FusedRmsNorm.apply(input, weight, normalized_shape, eps)


CUDA_KERNELS: dict[Callable, Callable] = {F.rms_norm: fused_rms_norm,
                                          torch.rms_norm: fused_rms_norm}
"""Functions whose CUDA kernel keeps other tensors than CPU's, with the rewrite that keeps
CUDA's (the autocast rewrites, which also take these calls, run it in their place)."""
