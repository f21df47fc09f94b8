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
SDPA                   ``transformers/cuda/sdp_utils.cpp``: cuDNN (sm90/100),  substituted
                       flash, memory-efficient or math by dtype, head dims,    (sdpa_backend)
                       mask, dropout, causal shape, compute capability;
                       fused ones keep output + log-sum-exp, math S x S
autocast policies      ``autocast_mode.cpp`` AutocastCUDA vs AutocastCPU       substituted
                       registrations (lower, fp32, set_opt_dtype, promote)     (cuda_autocast;
                                                                              audit in
                                                                              cuda_autocast_
                                                                              audit, a few
                                                                              linalg ops
                                                                              listed as
                                                                              unsupported)
softmax (fp16, mixed)  ``native/SoftMax.cpp``: Half -> Float result via        substituted
                       ``half_to_float`` without a float32 copy (CUDA only)    (cuda_autocast)
fused Adam/AdamW/SGD   ``native/cuda/fused_adam_impl.cu``: in place, no        modelled in
                       parameter-sized temporaries                             optimizers.py
rms_norm (RMSNorm)     ``native/layer_norm.cpp``: ``_fused_rms_norm``, one      substituted
                       CUDA kernel saving input, weight and a float32 rstd     (cuda_rms_norm)
                       per row; CPU decomposes, saving float32 copies
embedding backward     ``native/cuda/Embedding.cu``: over 3072 indices (or     substituted
                       ``scale_grad_by_freq``) sorts them and reduces per      (cuda_embedding)
                       segment: index copies and a float32 per-segment
                       gradient beside the result; CPU accumulates in place
cross_entropy          ``native/LossNLL.cpp``: composite (log_softmax then    same as CPU
                       nll_loss) on both devices, label smoothing too; no
                       fused CUDA kernel
cuDNN batch norm       ``cudnn/BatchNorm.cpp``: fp32 save_mean/invstd (as     listed as
                       CPU) plus a reserve space and a backward workspace      unsupported
cuDNN RNN/LSTM/GRU     ``cudnn/RNN.cpp``: reserve space, workspace, weight    listed as
                       buffer; CPU runs cell by cell                           unsupported
=====================  =====================================================  ==============

Unsupported entries (``UNMODELLED``) are named in a report's ``unsupported`` lines when the
traced step calls them.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from memcalc.errors import TraceError
from memcalc.trace._torch_internals import is_fake_tensor
from memcalc.trace.sdpa_backend import (AttentionCall, cuda_sdpa_backend, fused_attention,
                                        math_attention)

ASSUMED_CAPABILITY = (8, 0)
"""Compute capability assumed when no GPU is named (an A100)."""

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


@dataclass
class CudaTarget:
    """The GPU a trace is made for, and what the substitutions chose for it."""

    capability: tuple[int, int] = ASSUMED_CAPABILITY
    attention_backends: Counter = field(default_factory=Counter)
    unmodelled: set = field(default_factory=set)
    """``UNMODELLED`` entries the step called."""


_TARGET: ContextVar[CudaTarget] = ContextVar("cuda_target", default=CudaTarget())


@cuda_substitute(F.scaled_dot_product_attention)
def _attention_as_on_cuda(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                          scale=None, *, enable_gqa=False):
    """The backend CUDA picks for this call (``sdpa_backend``). Flash, memory-efficient and
    cuDNN attention keep the output and a log-sum-exp per row, also with dropout (the mask
    is regenerated from the RNG seed): CPU's flash kernel, run without dropout, keeps the
    same. The math backend runs step by step with CUDA's 1-byte dropout mask. Under autocast
    the inputs are cast first (SDPA is on both lower-precision lists). DTensors (context
    parallelism: ``memcalc.trace.context_parallel``) go to the fused op itself, which torch's
    ring attention runs. So does a fake call on the memory-efficient backend without a mask
    (float32 on most GPUs): its output is laid out (batch, sequence, heads, dim) whatever the
    query's layout, where CPU's kernel follows the query's, so a model's
    ``out.transpose(1, 2).contiguous()`` copies on the CPU and not on CUDA (a
    float32 Llama rank on an H200 held one such copy per block less than the CPU trace). That
    kernel's RNG seed and offset (two int64 scalars, kept on the host by CUDA) are counted as
    16 device bytes."""
    autocast = torch.is_autocast_enabled("cpu")
    if autocast:
        low = torch.get_autocast_dtype("cpu")
        query, key, value, attn_mask = (
            t.to(low) if t is not None and t.is_floating_point() else t
            for t in (query, key, value, attn_mask))
    target = _TARGET.get()
    backend = cuda_sdpa_backend(AttentionCall.of(query, key, value, attn_mask, dropout_p,
                                                 is_causal), target.capability)
    target.attention_backends[backend] += 1
    gqa = {"enable_gqa": True} if enable_gqa else {}
    with torch.autocast("cpu", enabled=False) if autocast else contextlib.nullcontext():
        ring = hasattr(query, "placements")
        if ring and backend == "math":
            raise TraceError("context parallelism needs a fused attention kernel (flash, "
                             "memory-efficient or cuDNN); CUDA would run this attention on "
                             "the math one")
        if ring or (backend == "efficient" and attn_mask is None and is_fake_tensor(query)
                    and key.shape[-3] == query.shape[-3]):
            return fused_attention(backend, query, key, value, is_causal, scale)
        if backend == "math":
            return math_attention(query, key, value, attn_mask, dropout_p, is_causal,
                                  scale=scale, enable_gqa=enable_gqa,
                                  dropout=lambda x, p: _fused_dropout(x, p, True))
        return _ORIGINAL_SDPA(query, key, value, attn_mask=attn_mask, dropout_p=0.0,
                              is_causal=is_causal, scale=scale, **gqa)


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


UNMODELLED: dict[Callable, str] = {
    **dict.fromkeys([F.batch_norm, torch.batch_norm],
                    "cuDNN batch norm: its reserve space and backward workspace are not traced "
                    "(saved mean and inverse std are, as on CPU)"),
    **dict.fromkeys([torch.lstm, torch.gru, torch.rnn_tanh, torch.rnn_relu],
                    "cuDNN RNN (LSTM/GRU/RNN): traced as CPU's cell-by-cell graph; cuDNN's "
                    "reserve space, workspace and flattened weight buffer are not modelled"),
}
"""Calls whose CUDA kernel keeps tensors the trace cannot model; reports list those used."""


class CudaKernelMode(TorchFunctionMode):
    """Apply every registered substitution to calls made while the mode is active, for a GPU
    of the given compute capability (``target`` holds what was chosen for it)."""

    def __init__(self, capability: tuple[int, int] | None = None):
        super().__init__()
        self.target = CudaTarget(capability or ASSUMED_CAPABILITY)
        self._tokens: list = []        # entered again around a checkpoint's recomputation

    def __enter__(self):
        self._tokens.append(_TARGET.set(self.target))
        return super().__enter__()

    def __exit__(self, *exc):
        _TARGET.reset(self._tokens.pop())
        return super().__exit__(*exc)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in UNMODELLED:
            self.target.unmodelled.add(UNMODELLED[func])
        rewrite = _SUBSTITUTES.get(func)
        # The mode is not active inside its own handler, so these calls are not re-intercepted.
        if rewrite is not None:
            return rewrite(*args, **kwargs)
        return func(*args, **kwargs)


def substituted_functions() -> list[str]:
    return sorted(function.__name__ for function in _SUBSTITUTES)


# CUDA autocast's float32 and promote lists and the embedding backward register on import.
from memcalc.trace import cuda_autocast, cuda_embedding  # noqa: E402,F401
