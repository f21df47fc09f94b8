"""CUDA autocast's cast policies, as CUDA-target substitutions of the Python calls that reach them.

The trace runs on CPU, under CPU autocast, whose lists differ from CUDA's. Each rewrite here
runs its call as CUDA autocast would (``aten/src/ATen/autocast_mode.cpp``, the ``AutocastCUDA``
registrations) and with CPU autocast off inside, as CUDA's wrappers exclude autocast below
themselves:

- ``lower``: floating arguments cast to the autocast dtype (CUDA-only: ``addmv``, ``addr``,
  ``mv``, the RNN cells);
- ``fp32``: float16/bfloat16 arguments cast to float32 (a copy, which the op may save);
- ``fp32_set_opt_dtype``: the op is asked for a float32 result unless the call names a
  ``dtype``; a float16 softmax / log-softmax runs the ``half_to_float`` kernel, reading the
  input without a float32 copy (``SoftMax.cpp``: only for Half on CUDA);
- ``promote``: floating arguments cast to the widest floating dtype among them;
- ``input dtype``: ops only CPU autocast runs in float32 (3D pools, pads, ``trace``, FFTs...)
  run in their input's dtype, as on CUDA;
- ``refuse``: ``binary_cross_entropy`` raises under CUDA autocast, as CUDA does.

``tests/test_cuda_autocast.py`` holds every rewrite to the installed torch's own
``AutocastCUDA`` kernels, run on fake CUDA tensors (no GPU needed), and checks that every op
registered for one autocast and not the other is in ``AUDIT`` below.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.utils._pytree import tree_leaves, tree_map

from memcalc.trace._torch_internals import is_fake_tensor
from memcalc.trace.cuda_kernels import cuda_substitute
from memcalc.trace.cuda_rms_norm import CUDA_KERNELS

_LOW = (torch.float16, torch.bfloat16)


def _cast(value, dtype: torch.dtype, kinds: tuple[torch.dtype, ...]):
    if isinstance(value, torch.Tensor) and value.dtype in kinds:
        return value.to(dtype)
    return value


def _as_cuda_autocast(function: Callable, cast: Callable) -> Callable:
    """``function`` with its arguments cast by ``cast(args, kwargs)`` and CPU autocast off."""

    def rewrite(*args, **kwargs):
        if not torch.is_autocast_enabled("cpu"):
            return function(*args, **kwargs)
        args, kwargs = cast(args, kwargs)
        with torch.autocast("cpu", enabled=False):
            return function(*args, **kwargs)

    return rewrite


def _to_lower(args, kwargs):
    low = torch.get_autocast_dtype("cpu")
    return tree_map(lambda v: _cast(v, low, (torch.float32, torch.float64, *_LOW)), (args, kwargs))


def _to_float32(args, kwargs):
    return tree_map(lambda v: _cast(v, torch.float32, _LOW), (args, kwargs))


def _first_tensor(args) -> torch.Tensor | None:
    return next((v for v in tree_leaves(args) if isinstance(v, torch.Tensor)), None)


def _float32_result(args, kwargs):
    first = _first_tensor(args)
    if kwargs.get("dtype") is None and first is not None and first.dtype in _LOW:
        kwargs = {**kwargs, "dtype": torch.float32}
    return args, kwargs


def _to_widest(args, kwargs):
    widest = None
    for value in tree_leaves((args, kwargs)):
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            widest = value.dtype if widest is None else torch.promote_types(widest, value.dtype)
    if widest is None:
        return args, kwargs
    return tree_map(lambda v: _cast(v, widest, (torch.float16, torch.bfloat16, torch.float32)),
                    (args, kwargs))


def _unchanged(args, kwargs):
    return args, kwargs


def _softmax_half_to_float(log: bool) -> Callable:
    """softmax / log_softmax under CUDA autocast: float32 result; a float16 input is read by the
    ``half_to_float`` kernel without a float32 copy, a bfloat16 one is converted first."""
    kernel = torch._log_softmax if log else torch._softmax
    public = torch.log_softmax if log else torch.softmax

    def rewrite(tensor, dim=None, _stacklevel=3, dtype=None):
        if isinstance(_stacklevel, torch.dtype):   # torch.softmax(input, dim, dtype)
            _stacklevel, dtype = 3, _stacklevel
        if dim is None:
            dim = F._get_softmax_dim("log_softmax" if log else "softmax", tensor.dim(), _stacklevel)
        if not torch.is_autocast_enabled("cpu") or dtype is not None or tensor.dtype not in _LOW:
            return public(tensor, dim, dtype=dtype)
        with torch.autocast("cpu", enabled=False):
            if tensor.dtype is torch.float16 and is_fake_tensor(tensor):
                return kernel(tensor, dim, True)
            # bfloat16 (converted on CUDA too), or a real CPU tensor, whose kernel refuses
            # half_to_float: the float32 copy is made here
            return public(tensor.float(), dim)

    return rewrite


def _pair(name: str) -> list[Callable]:
    """``torch.name`` and ``Tensor.name`` where they exist."""
    return [f for f in (getattr(torch, name, None), getattr(torch.Tensor, name, None)) if f]


def _interpolate(*args, **kwargs):
    """``F.interpolate``: CUDA runs the upsample kernels in float32; ``area`` is an adaptive
    average pool, which CUDA autocast leaves in the input's dtype."""
    mode = kwargs.get("mode", args[3] if len(args) > 3 else "nearest")
    cast = _unchanged if mode == "area" else _to_float32
    return _as_cuda_autocast(F.interpolate, cast)(*args, **kwargs)


_CROSS_ENTROPY = inspect.signature(F.cross_entropy)


def _cross_entropy(*args, **kwargs):
    """``F.cross_entropy``: CUDA autocast does not wrap ``cross_entropy_loss`` but its parts
    (``LossNLL.cpp``): ``log_softmax(self, class_dim, self.scalar_type())`` names the input's
    dtype, so it runs in float16/bfloat16 and keeps that output, then ``nll_loss`` (fp32
    list) casts it to a float32 copy, which it keeps too. Label smoothing and probability
    targets run here on a float32 copy of the input (their parts are not rewritten)."""
    bound = _CROSS_ENTROPY.bind(*args, **kwargs)
    bound.apply_defaults()
    call = dict(bound.arguments)
    input, target = call["input"], call["target"]
    if not torch.is_autocast_enabled("cpu") or input.dtype not in _LOW:
        return F.cross_entropy(*args, **kwargs)
    call["weight"] = _cast(call["weight"], torch.float32, _LOW)
    with torch.autocast("cpu", enabled=False):
        if call["label_smoothing"] > 0.0 or target.shape == input.shape:
            return F.cross_entropy(**{**call, "input": input.float()})
        del call["label_smoothing"]
        log_probabilities = torch.log_softmax(input, 0 if input.dim() == 1 else 1, input.dtype)
        return F.nll_loss(**{**call, "input": log_probabilities.float()})


def _refuse_binary_cross_entropy(*args, **kwargs):
    if torch.is_autocast_enabled("cpu"):
        raise RuntimeError(
            "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to "
            "autocast; CUDA autocast refuses them: use binary_cross_entropy_with_logits "
            "(BCEWithLogitsLoss), or run the loss outside autocast")
    return F.binary_cross_entropy(*args, **kwargs)


LOWER = [torch.addmv, torch.Tensor.addmv, torch.addr, torch.Tensor.addr, torch.mv,
         torch.Tensor.mv, torch.lstm_cell, torch.gru_cell, torch.rnn_tanh_cell,
         torch.rnn_relu_cell]
_UNARY_FP32 = ["acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2",
               "log1p", "reciprocal", "rsqrt", "sinh", "tan", "pow", "logsumexp", "renorm",
               "dist", "cdist", "cosine_similarity", "layer_norm", "group_norm", "rms_norm",
               "frobenius_norm", "nuclear_norm"]
FP32 = [f for name in _UNARY_FP32 for f in _pair(name)] + [
    torch.Tensor.__pow__, torch.Tensor.__rpow__, F.softplus, F.pdist, F.layer_norm,
    F.group_norm, F.rms_norm, F.nll_loss, F.poisson_nll_loss, F.cosine_embedding_loss,
    F.hinge_embedding_loss, F.kl_div, F.l1_loss, F.smooth_l1_loss, F.huber_loss, F.mse_loss,
    F.margin_ranking_loss, F.multilabel_margin_loss, F.soft_margin_loss,
    F.triplet_margin_loss, F.multi_margin_loss, F.binary_cross_entropy_with_logits,
]
FP32_SET_OPT_DTYPE = [f for name in ("prod", "cumprod", "cumsum", "sum", "norm")
                      for f in _pair(name)] + [torch.linalg.vector_norm, torch.linalg.matrix_norm]
PROMOTE = [f for name in ("addcdiv", "addcmul", "atan2", "dot", "vdot", "index_put",
                          "scatter_add", "tensordot", "cross", "grid_sampler")
           for f in _pair(name)] + [F.bilinear, F.grid_sample]
INPUT_DTYPE = [
    F.max_pool3d, F.avg_pool3d, F.adaptive_avg_pool3d, F.adaptive_max_pool3d, F.max_unpool2d,
    F.max_unpool3d, F.fractional_max_pool2d, F.fractional_max_pool3d, F.pad, torch.trace,
    torch.Tensor.trace, torch.stft, torch.Tensor.stft,
    *(getattr(torch.fft, name) for name in ("fft", "ifft", "fft2", "ifft2", "fftn", "ifftn",
                                            "rfft", "irfft", "rfft2", "irfft2", "rfftn",
                                            "irfftn", "hfft", "ihfft")),
]

for _functions, _cast_for in ((LOWER, _to_lower), (FP32, _to_float32), (PROMOTE, _to_widest),
                              (FP32_SET_OPT_DTYPE, _float32_result), (INPUT_DTYPE, _unchanged)):
    for _function in dict.fromkeys(_functions):
        cuda_substitute(_function)(_as_cuda_autocast(CUDA_KERNELS.get(_function, _function),
                                                     _cast_for))
for _log, _functions in ((False, (torch.softmax, F.softmax, torch.Tensor.softmax)),
                         (True, (torch.log_softmax, F.log_softmax, torch.Tensor.log_softmax))):
    for _function in _functions:
        cuda_substitute(_function)(_softmax_half_to_float(_log))
cuda_substitute(F.interpolate)(_interpolate)
cuda_substitute(F.binary_cross_entropy)(_refuse_binary_cross_entropy)
cuda_substitute(F.cross_entropy)(_cross_entropy)
