"""CUDA autocast's float32 and promote lists, as CUDA-target substitutions.

The trace runs CPU autocast, whose lists differ from CUDA's. These rewrites reproduce CUDA's
policy (``aten/src/ATen/autocast_mode.cpp``, the CUDA ``KERNEL_CUDA`` registrations of
``AT_FORALL_FP32``, ``AT_FORALL_FP32_SET_OPT_DTYPE``, ``AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE``
and ``AT_FORALL_PROMOTE``) at the Python entry points that reach those ATen ops: a float16 or
bfloat16 argument is cast to float32 (``fp32``), unless the call names a ``dtype``
(``fp32_set_opt_dtype``), or every floating argument is cast to the widest floating dtype among
them (``promote``). The normalisations and softmaxes live in ``cuda_kernels``. In-place
variants are not on CUDA's lists and are left alone. Upsampling and grid sampling (fp32 on CPU
autocast) are not on the CUDA fp32 list this follows and keep the CPU policy.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.utils._pytree import tree_map

from memcalc.trace.cuda_kernels import cuda_substitute

_LOW = (torch.float16, torch.bfloat16)


def _cast_low(value, dtype: torch.dtype):
    """``value`` cast to ``dtype`` when it is a float16/bfloat16 tensor, else unchanged."""
    if isinstance(value, torch.Tensor) and value.dtype in _LOW:
        return value.to(dtype)
    return value


def _in_float32(function: Callable) -> Callable:
    """``fp32`` policy: low-precision tensor arguments run in float32 under autocast."""

    def rewrite(*args, **kwargs):
        if torch.is_autocast_enabled("cpu"):
            args, kwargs = tree_map(lambda v: _cast_low(v, torch.float32), (args, kwargs))
        return function(*args, **kwargs)

    return rewrite


def _in_float32_unless_dtype(function: Callable) -> Callable:
    """``fp32_set_opt_dtype`` policy: float32 unless the call gives its own ``dtype``."""
    cast = _in_float32(function)

    def rewrite(*args, **kwargs):
        if kwargs.get("dtype") is not None:
            return function(*args, **kwargs)
        return cast(*args, **kwargs)

    return rewrite


def _widest_floating(args, kwargs) -> torch.dtype | None:
    """The widest floating dtype among the tensor arguments (``promote_type`` order)."""
    widest = None
    for value in torch.utils._pytree.tree_leaves((args, kwargs)):
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            widest = value.dtype if widest is None else torch.promote_types(widest, value.dtype)
    return widest


def _promoted(function: Callable) -> Callable:
    """``promote`` policy: floating arguments are cast to the widest floating dtype."""

    def rewrite(*args, **kwargs):
        widest = _widest_floating(args, kwargs) if torch.is_autocast_enabled("cpu") else None
        if widest is not None and widest not in _LOW:
            args, kwargs = tree_map(lambda v: _cast_low(v, widest), (args, kwargs))
        return function(*args, **kwargs)

    return rewrite


def _pair(name: str) -> list[Callable]:
    """``torch.name`` and ``Tensor.name`` where they exist."""
    return [f for f in (getattr(torch, name, None), getattr(torch.Tensor, name, None)) if f]


_UNARY_FP32 = ["acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2",
               "log1p", "reciprocal", "rsqrt", "sinh", "tan", "pow", "logsumexp", "renorm",
               "dist", "cdist", "norm", "cosine_similarity"]
FP32 = [f for name in _UNARY_FP32 for f in _pair(name)] + [
    torch.Tensor.__pow__, torch.Tensor.__rpow__, F.softplus, F.cosine_similarity, F.pdist,
    F.cross_entropy, F.nll_loss, F.poisson_nll_loss, F.cosine_embedding_loss,
    F.hinge_embedding_loss, F.kl_div, F.l1_loss, F.smooth_l1_loss, F.huber_loss, F.mse_loss,
    F.margin_ranking_loss, F.multilabel_margin_loss, F.soft_margin_loss,
    F.triplet_margin_loss, F.multi_margin_loss, F.binary_cross_entropy_with_logits,
]
FP32_SET_OPT_DTYPE = [f for name in ("prod", "cumprod", "cumsum", "sum") for f in _pair(name)] + [
    torch.linalg.vector_norm, torch.linalg.matrix_norm,
]
PROMOTE = [f for name in ("addcdiv", "addcmul", "atan2", "dot", "index_put", "scatter_add",
                          "tensordot", "cross") for f in _pair(name)] + [F.bilinear]

for _function in dict.fromkeys(FP32):
    cuda_substitute(_function)(_in_float32(_function))
for _function in FP32_SET_OPT_DTYPE:
    cuda_substitute(_function)(_in_float32_unless_dtype(_function))
for _function in PROMOTE:
    cuda_substitute(_function)(_promoted(_function))
