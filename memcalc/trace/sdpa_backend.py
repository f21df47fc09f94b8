"""Which kernel CUDA runs for ``F.scaled_dot_product_attention``, and the math one, as on CUDA.

``cuda_sdpa_backend`` follows ``select_sdp_backend`` in PyTorch's
``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp`` for dense inputs: the backends are
tried in priority order (cuDNN attention first on sm90/sm100, where torch builds with cuDNN
newer than 9.15 prefer it; then flash, memory-efficient, math) and the first whose checks pass
runs. What each keeps for backward:

- flash and cuDNN: the output and one float32 log-sum-exp per query row;
- memory-efficient: the same, the log-sum-exp padded to 32 rows, and the mask if one is given;
- math: the S x S probabilities (in float32 for half inputs, as
  ``allow_fp16_bf16_reduction_math_sdp`` is off by default), the dropout mask and the dropped
  probabilities — ``math_attention`` below, a transcription of
  ``_scaled_dot_product_attention_math`` (``transformers/attention.cpp``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

_HALF = (torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class AttentionCall:
    """What the backend choice depends on, read off one call's arguments."""

    dtype: torch.dtype
    head_dim_qk: int
    head_dim_v: int
    seq_q: int
    seq_k: int
    has_mask: bool
    dropout_p: float
    is_causal: bool
    requires_grad: bool

    @classmethod
    def of(cls, query, key, value, attn_mask, dropout_p, is_causal) -> AttentionCall:
        return cls(query.dtype, query.shape[-1], value.shape[-1], query.shape[-2],
                   key.shape[-2], attn_mask is not None, float(dropout_p), bool(is_causal),
                   torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value)))


def _sm(capability: tuple[int, int], low: tuple[int, int], high: tuple[int, int]) -> bool:
    return low <= capability <= high


def can_use_cudnn(call: AttentionCall, capability: tuple[int, int]) -> bool:
    limit = 128   # 256 needs cuDNN > 9.22 and a newer frontend; 192/128 from cuDNN 9.11
    wide = (call.head_dim_qk, call.head_dim_v) == (192, 128) and capability[0] in (9, 10)
    return (call.dtype in _HALF and _sm(capability, (8, 0), (12, 1))
            and call.dropout_p * 16 == math.floor(call.dropout_p * 16)
            and (wide or max(call.head_dim_qk, call.head_dim_v) <= limit)
            and call.head_dim_qk % 8 == 0 and call.head_dim_v % 8 == 0
            and call.seq_k != 1 and not (call.dropout_p > 0 and call.seq_q == 1))


def can_use_flash(call: AttentionCall, capability: tuple[int, int]) -> bool:
    if call.has_mask or call.head_dim_qk != call.head_dim_v or call.head_dim_qk > 256:
        return False
    if not _sm(capability, (8, 0), (12, 1)) or call.dtype not in _HALF:
        return False
    if call.requires_grad and (_sm(capability, (8, 6), (8, 9)) or _sm(capability, (12, 0), (12, 1))):
        if not (call.head_dim_qk <= 192 or (call.dropout_p == 0 and call.head_dim_qk > 224)):
            return False
    return not (call.is_causal and call.seq_q != call.seq_k)


def can_use_efficient(call: AttentionCall, capability: tuple[int, int]) -> bool:
    if not _sm(capability, (5, 0), (12, 1)):
        return False
    half = call.dtype in _HALF
    tensor_cores = capability[0] >= 8 or (capability[0] >= 7 and half)
    alignment = 4 if capability[0] >= 8 else 1
    if tensor_cores:
        alignment = max(alignment, 128 // (16 if half else 32))
    dtypes = (torch.float16, torch.float32, torch.bfloat16) if capability[0] >= 8 else \
        (torch.float16, torch.float32)
    return (call.dtype in dtypes and call.head_dim_qk % alignment == 0
            and call.head_dim_v % alignment == 0)


def cuda_sdpa_backend(call: AttentionCall, capability: tuple[int, int]) -> str:
    """``cudnn``, ``flash``, ``efficient`` or ``math``: the first backend whose checks pass."""
    order = [("flash", can_use_flash), ("efficient", can_use_efficient)]
    if capability[0] in (9, 10):
        order.insert(0, ("cudnn", can_use_cudnn))
    return next((name for name, usable in order if usable(call, capability)), "math")


def math_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *,
                   scale=None, enable_gqa=False, dropout):
    """The math kernel step by step, ``dropout(tensor, p)`` standing for ``at::dropout``."""
    origin = query.dtype
    upcast = origin in _HALF and not torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed()
    query, key, value = (t.float() if upcast else t for t in (query, key, value))
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        attn_mask = torch.zeros_like(attn_mask, dtype=origin).masked_fill(~attn_mask, float("-inf"))
    factor = math.sqrt(scale if scale is not None else 1.0 / math.sqrt(query.shape[-1]))
    query = query * factor
    if is_causal:
        causal = torch.ones(query.shape[-2], key.shape[-2], dtype=torch.bool).tril()
        attn_mask = torch.zeros_like(causal, dtype=query.dtype).masked_fill(~causal, float("-inf"))
    if enable_gqa and key.shape[-3] != query.shape[-3]:
        repeats = query.shape[-3] // key.shape[-3]
        key, value = key.repeat_interleave(repeats, -3), value.repeat_interleave(repeats, -3)
    scores = torch.matmul(query, key.transpose(-2, -1) * factor)
    if attn_mask is not None:
        scores.add_(attn_mask)
    probabilities = torch._safe_softmax(scores, -1)
    if dropout_p > 0.0:
        probabilities = dropout(probabilities, dropout_p)
    probabilities.to(origin)   # the kernel's second output, dropped by the public function
    return torch.matmul(probabilities, value).to(origin)


def fused_attention(backend: str, query, key, value, is_causal: bool, scale: float | None):
    """The output of ``backend``'s fused attention op called directly, as torch's ring
    attention (context parallelism) takes it: the memory-efficient op for ``efficient``, the
    flash op for flash and cuDNN (each keeps the output and a float32 log-sum-exp per row)."""
    if backend == "efficient":
        return torch.ops.aten._scaled_dot_product_efficient_attention(
            query, key, value, None, True, 0.0, is_causal, scale=scale)[0]
    return torch.ops.aten._scaled_dot_product_flash_attention(
        query, key, value, 0.0, is_causal, scale=scale)[0]
