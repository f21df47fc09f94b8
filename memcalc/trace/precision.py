"""Precision policies: parameter dtype and autocast dtype for each ``Precision``."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from memcalc.specs import Precision


@dataclass(frozen=True)
class PrecisionPolicy:
    """How a precision mode stores weights and runs ops."""

    parameter_dtype: torch.dtype
    autocast_dtype: torch.dtype | None
    assumption: str

    def batch_dtype(self, input_dtype: torch.dtype) -> torch.dtype:
        """dtype of the batch on the device: pure half precision casts a float batch to it."""
        if input_dtype.is_floating_point and self.autocast_dtype is None:
            return self.parameter_dtype
        return input_dtype


POLICIES: dict[Precision, PrecisionPolicy] = {
    Precision.FP32: PrecisionPolicy(
        torch.float32, None, "fp32: parameters, gradients and optimizer state in float32."
    ),
    Precision.BF16_MIXED: PrecisionPolicy(
        torch.float32,
        torch.bfloat16,
        "bf16-mixed: torch.autocast(bfloat16); parameters stay float32 and are the master "
        "weights, gradients and optimizer state are float32; the bfloat16 working copies of "
        "weights that autocast makes are traced (they live through forward and backward).",
    ),
    Precision.FP16_MIXED: PrecisionPolicy(
        torch.float32,
        torch.float16,
        "fp16-mixed: torch.autocast(float16) with float32 master parameters, gradients and "
        "optimizer state; GradScaler's scale and inf-check scalars (a few bytes) are not traced.",
    ),
    Precision.BF16: PrecisionPolicy(
        torch.bfloat16,
        None,
        "bf16 (pure): parameters, gradients, optimizer state and the float input batch in "
        "bfloat16; no float32 master copy.",
    ),
    Precision.FP16: PrecisionPolicy(
        torch.float16,
        None,
        "fp16 (pure): parameters, gradients, optimizer state and the float input batch in "
        "float16; no float32 master copy.",
    ),
}


def precision_policy(precision: Precision) -> PrecisionPolicy:
    return POLICIES[Precision(precision)]


def cpu_autocast(dtype: torch.dtype | None, cache: bool = True) -> contextlib.AbstractContextManager:
    """``torch.autocast("cpu", dtype)`` for mixed precision; nothing otherwise. ``cache``:
    half-precision copies of the weights are kept for the autocast region (as autocast does
    outside ``inference_mode``)."""
    return (torch.autocast("cpu", dtype=dtype, cache_enabled=cache) if dtype is not None
            else contextlib.nullcontext())
