"""Kernels whose memory on CUDA differs from the CPU kernel the trace runs, as substitutions.

Each entry maps a public torch function to a pure rewrite of its call that, on CPU, keeps
the same tensors alive that the CUDA kernel would. The mode applies them during a trace
made for a CUDA target. Adding a kernel is one ``@cuda_substitute`` function.

Audit (PyTorch sources, ``aten/src/ATen``):

=====================  =====================================================  ==============
op                     CUDA kernel vs the CPU one                              decision
=====================  =====================================================  ==============
dropout (not inplace)  ``native/Dropout.cpp``: ``is_fused_kernel_acceptable``  substituted
                       sends CUDA to ``native_dropout`` (bool mask saved);
                       CPU decomposes to ``input * noise`` (noise in dtype)
dropout_ / feature /   ``Dropout.cpp``: ``_dropout<inplace>`` on both          same as CPU
alpha dropout          devices
SDPA with dropout      ``transformers/sdp_utils.cpp``: flash/efficient keep   substituted
                       output + log-sum-exp; CPU math keeps S x S
autocast fp32 lists    ``autocast_mode.cpp`` CUDA ``fp32``,                    substituted
                       ``fp32_set_opt_dtype``, ``promote``                     (cuda_autocast)
CPU-only fp32 ops      ``autocast_mode.cpp`` AutocastCPU fp32 pools, pads      substituted
fused Adam/AdamW/SGD   ``native/cuda/fused_adam_impl.cu``: in place, no        modelled in
                       parameter-sized temporaries                             optimizers.py
SDPA backend choice    ``sdp_utils.cpp``: flash needs sm80+ and head dim      not yet: flash
                       <= 256, efficient sm50+; cuDNN attention sm90          and efficient
                                                                              save the same
cuDNN batch norm       ``cudnn/BatchNorm.cpp``: fp32 save_mean/invstd (as     not yet: reserve
                       CPU) plus a reserve space                              space only
cuDNN RNN/LSTM/GRU     ``cudnn/RNN.cpp``: reserve space + workspace           not yet
=====================  =====================================================  ==============

The "not yet" rows are not listed in a report's ``unsupported`` lines yet: that needs the
trace's op names in the device report.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

_SUBSTITUTES: dict[Callable, Callable] = {}
_ORIGINAL_SDPA = F.scaled_dot_product_attention
_ORIGINAL_DROPOUT = F.dropout


def cuda_substitute(torch_function: Callable):
    """Register ``rewrite(*args, **kwargs)`` to run instead of ``torch_function`` for CUDA."""

    def register(rewrite: Callable) -> Callable:
        if torch_function in _SUBSTITUTES:
            raise ValueError(f"a CUDA substitute for {torch_function.__name__} is registered already")
        _SUBSTITUTES[torch_function] = rewrite
        return rewrite

    return register


@cuda_substitute(F.scaled_dot_product_attention)
def _sdpa_without_stored_dropout(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, **kwargs):
    """On CUDA, SDPA with dropout runs the flash or memory-efficient kernel, which saves the
    output and one log-sum-exp per row and regenerates the dropout mask from its RNG seed
    (pytorch ``sdp_utils.cpp``: both support dropout; memory-efficient needs sm50+). On CPU,
    dropout sends SDPA to the math kernel, which saves the S x S probabilities and the mask.
    Dropping ``dropout_p`` keeps the CPU on its flash kernel, whose saved tensors match."""
    return _ORIGINAL_SDPA(query, key, value, attn_mask=attn_mask, dropout_p=0.0,
                          is_causal=is_causal, scale=scale, **kwargs)


@cuda_substitute(F.dropout)
def _fused_dropout(input, p=0.5, training=True, inplace=False):
    """CUDA's ``at::dropout`` runs the fused ``native_dropout`` when training with 0 < p < 1
    on a non-empty tensor (``native/Dropout.cpp``, ``is_fused_kernel_acceptable``); its
    backward keeps only the 1-byte bool mask (``derivatives.yaml``: native_dropout_backward
    of ``result1``). CPU decomposes into ``input * noise`` keeping the noise in the input's
    dtype. In-place dropout is ``_dropout<true>`` on both devices and left alone."""
    if inplace or not training or not 0.0 < p < 1.0 or input.numel() == 0:
        return _ORIGINAL_DROPOUT(input, p, training, inplace)
    return torch.native_dropout(input, p, True)[0]


@cuda_substitute(torch.dropout)
def _fused_torch_dropout(input, p, train):
    return _fused_dropout(input, p, train)


def _in_float32_under_autocast(function: Callable) -> Callable:
    """CUDA autocast runs these ops in float32 (``autocast_mode.cpp``: layer_norm, group_norm
    in the fp32 list, softmax and log_softmax in fp32_set_opt_dtype); CPU autocast keeps them
    in the lower precision, so their saved outputs would be half the CUDA size."""

    def rewrite(tensor, *args, **kwargs):
        if torch.is_autocast_enabled("cpu") and tensor.dtype in (torch.float16, torch.bfloat16):
            tensor = tensor.float()
        return function(tensor, *args, **kwargs)

    return rewrite


CUDA_AUTOCAST_FP32 = [
    torch.softmax, F.softmax, torch.Tensor.softmax,
    torch.log_softmax, F.log_softmax, torch.Tensor.log_softmax,
    F.layer_norm, torch.layer_norm, F.group_norm, torch.group_norm,
]
for _function in CUDA_AUTOCAST_FP32:
    cuda_substitute(_function)(_in_float32_under_autocast(_function))


def _in_input_dtype_under_autocast(function: Callable) -> Callable:
    """CPU autocast runs these in float32 (``autocast_mode.cpp``, AutocastCPU's fp32 policy)
    while CUDA autocast leaves them alone, so on CUDA they run in their input's dtype: a
    3D U-Net's pools would otherwise keep an fp32 copy and an fp32 output per pool."""

    def rewrite(*args, **kwargs):
        if torch.is_autocast_enabled("cpu"):
            with torch.autocast("cpu", enabled=False):
                return function(*args, **kwargs)
        return function(*args, **kwargs)

    return rewrite


CPU_ONLY_AUTOCAST_FP32 = [
    F.max_pool3d, F.avg_pool3d, F.adaptive_avg_pool3d, F.adaptive_max_pool3d,
    F.max_unpool2d, F.max_unpool3d, F.fractional_max_pool2d, F.fractional_max_pool3d, F.pad,
]
for _function in CPU_ONLY_AUTOCAST_FP32:
    cuda_substitute(_function)(_in_input_dtype_under_autocast(_function))


class CudaKernelMode(TorchFunctionMode):
    """Apply every registered substitution to calls made while the mode is active."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        rewrite = _SUBSTITUTES.get(func)
        # The mode is not active inside its own handler, so these calls are not re-intercepted.
        if rewrite is not None:
            return rewrite(*args, **kwargs)
        return func(*args, **kwargs)


def substituted_functions() -> list[str]:
    return sorted(function.__name__ for function in _SUBSTITUTES)


# CUDA autocast's float32 and promote lists register themselves on import.
from memcalc.trace import cuda_autocast  # noqa: E402,F401
