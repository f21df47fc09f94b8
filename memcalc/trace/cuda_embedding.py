"""Embedding backward as CUDA runs it: the sort-and-segment path's scratch tensors.

``aten/src/ATen/native/cuda/Embedding.cu`` (``embedding_dense_backward_cuda``): with more than
3072 indices, or ``scale_grad_by_freq``, CUDA sorts the indices and reduces the gradient per
segment of equal indices (``EmbeddingBackwardKernel.cu``, ``embedding_backward_cuda_kernel``).
Alive together with the ``num_weights x dim`` gradient it returns:

- ``sorted_indices``, ``orig_indices`` (and ``count`` with ``scale_grad_by_freq``): one index
  per lookup each; ``segment_offsets``: one per lookup;
- ``partials_per_segment``, ``partials_per_segment_offset``: ``max_segments`` each, where
  ``max_segments = min(numel, num_weights)``; ``partial_segment_offset``: ``max_partial_segment``,
  where ``max_partial_segment = numel / NROWS_PER_THREAD + max_segments`` (NROWS_PER_THREAD 10);
- ``grad_weight_per_segment``: ``max_partial_segment x dim`` in the op-math type (float32 for
  fp16 and bf16 gradients), the largest: up to 1.1 x (lookups x dim) floats.

CPU's kernel accumulates straight into the gradient. The rewrite keeps CUDA's scratch alive
while the gradient is made, so the backward's peak is CUDA's. CUB's radix-sort workspace (a
few bytes per index) is not modelled. Fewer lookups without ``scale_grad_by_freq`` take the
direct kernel: no scratch, as on CPU. The trace still makes the scratch's tensors there,
empty (their records hold 0 bytes by the same rule), so that a step below the threshold
makes the same storages as one above it and both lie on one batch line
(``memcalc.trace.affine_trace``: an LM's batch 1 of 2,048 tokens beside its batch 8).
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

import torch
import torch.nn.functional as F

from memcalc.trace.cuda_kernels import cuda_substitute
from memcalc.trace.size_rules import sized_by

DIRECT_KERNEL_MAX_INDICES = 3072
NROWS_PER_THREAD = 10
_ORIGINAL_EMBEDDING = F.embedding


def embedding_backward_scratch_shapes(numel: int, num_weights: int, dim: int,
                                      scale_grad_by_freq: bool) -> list[tuple[int, ...]]:
    """Shapes of the index tensors (int64) and, last, the per-segment gradient CUDA keeps
    (empty where the direct kernel runs)."""
    if sort_path_skipped(numel, scale_grad_by_freq):
        return [(0,)] * len(embedding_backward_scratch_shapes(
            DIRECT_KERNEL_MAX_INDICES + 1, 1, dim, scale_grad_by_freq))
    max_segments = min(numel, num_weights)
    max_partial_segment = numel // NROWS_PER_THREAD + max_segments
    per_lookup = 4 if scale_grad_by_freq else 3      # sorted, orig, (count), segment offsets
    return [(numel,)] * per_lookup + [(max_segments,)] * 2 + [(max_partial_segment,),
                                                              (max_partial_segment, dim)]


def sort_path_skipped(numel: int, scale_grad_by_freq: bool) -> bool:
    """CUDA's direct kernel runs: no scratch."""
    return numel <= DIRECT_KERNEL_MAX_INDICES and not scale_grad_by_freq


@dataclass(frozen=True)
class EmbeddingScratch:
    """The bytes of scratch tensor ``index`` of an embedding backward over ``numel`` lookups
    (its ``min(numel, num_weights)`` and ``numel // 10`` are not affine in the batch)."""

    numel: int
    num_weights: int
    dim: int
    scale_grad_by_freq: bool
    index: int
    element_bytes: int

    @property
    def nbytes(self) -> int:
        shapes = embedding_backward_scratch_shapes(self.numel, self.num_weights, self.dim,
                                                   self.scale_grad_by_freq)
        return prod(shapes[self.index]) * self.element_bytes


class _EmbeddingAsOnCuda(torch.autograd.Function):
    @staticmethod
    def forward(ctx, weight, indices, padding_idx, scale_grad_by_freq):
        ctx.save_for_backward(indices)
        ctx.num_weights, ctx.padding_idx = weight.shape[0], padding_idx
        ctx.scale_grad_by_freq = scale_grad_by_freq
        return torch.embedding(weight, indices, padding_idx, scale_grad_by_freq, False)

    @staticmethod
    def backward(ctx, grad):
        (indices,) = ctx.saved_tensors
        shapes = embedding_backward_scratch_shapes(indices.numel(), ctx.num_weights,
                                                   grad.shape[-1], ctx.scale_grad_by_freq)
        op_math = torch.float32 if grad.dtype in (torch.float16, torch.bfloat16) else grad.dtype
        scratch = [torch.empty(shape, dtype=torch.int64, device=grad.device)
                   for shape in shapes[:-1]]
        scratch.append(torch.empty(shapes[-1], dtype=op_math, device=grad.device))
        for index, tensor in enumerate(scratch):
            sized_by(tensor, EmbeddingScratch(indices.numel(), ctx.num_weights, grad.shape[-1],
                                              ctx.scale_grad_by_freq, index,
                                              tensor.element_size()))
        grad_weight = torch.ops.aten.embedding_dense_backward(
            grad, indices, ctx.num_weights, ctx.padding_idx, ctx.scale_grad_by_freq)
        del scratch
        return grad_weight, None, None, None


@cuda_substitute(F.embedding)
def _embedding_as_on_cuda(input, weight, padding_idx=None, max_norm=None, norm_type=2.0,
                          scale_grad_by_freq=False, sparse=False):
    """A dense, trainable lookup gets CUDA's backward; anything else runs as it is."""
    if sparse or max_norm is not None or not (weight.requires_grad and torch.is_grad_enabled()):
        return _ORIGINAL_EMBEDDING(input, weight, padding_idx, max_norm, norm_type,
                                   scale_grad_by_freq, sparse)
    if padding_idx is None:
        padding_idx = -1
    elif padding_idx < 0:
        padding_idx += weight.shape[0]
    return _EmbeddingAsOnCuda.apply(weight, input, padding_idx, scale_grad_by_freq)
