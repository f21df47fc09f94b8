"""Spatial parallelism (domain decomposition): every sample's volume is split along one
spatial axis over G GPUs, and each GPU runs the whole model on its slab.

A convolution or pooling window that reaches across a slab border needs the neighbouring
slab's rows first (its halo): the rank receives ``padding`` rows from each neighbour,
concatenates them to its slab and convolves without padding along that axis, so its output
is exactly its share of the unsharded output (halo exchange, as DistDL, LBANN and
PhysicsNeMo's ShardTensor do it). Backward returns the halos' gradients to the neighbours.
Weights are replicated and their gradients all-reduced as in DDP; normalisation statistics
and global pooling all-reduce per-channel sums.

In the trace the halos are new tensors of the neighbour rows' shape (the receive buffers)
and the concatenation is real, so both are in the ledger; the received bytes per iteration
are counted for the exchange time. The traced rank is an interior one (two neighbours).

Known limitations: halo rows = the layer's padding on each side (the "same"-padded layers of
CNNs; an unpadded window would need k−1 rows more and is traced without them); upsampling
by interpolation gets no halo; per-channel all-reduce buffers are not counted; attention and
linear layers over the spatial axes cannot be split this way (the trace then fails).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from memcalc.model.layout import CONV_TYPES
from memcalc.trace._torch_internals import set_padding_mode_cache
from memcalc.trace.ledger import IterationBytes

_POOL_TYPES = (nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d, nn.AvgPool1d, nn.AvgPool2d,
               nn.AvgPool3d)
MAX_ALIGNMENT = 32
"""Slabs keep the full axis's divisibility by powers of two up to this (total stride of
common CNNs), so that every rank's strided layers line up as on the full volume."""


PadWithHalos = Callable[[torch.Tensor, int, int], torch.Tensor]
"""``(slab, batch_axis, rows) → slab with ``rows`` halo rows on both sides of the axis``."""


class ZeroHalos(IterationBytes):
    """Halos for the trace: new tensors of the neighbours' rows (the receive buffers); the
    bytes received per iteration are counted."""

    def __call__(self, slab: torch.Tensor, batch_axis: int, rows: int) -> torch.Tensor:
        shape = list(slab.shape)
        shape[batch_axis] = rows
        before, after = slab.new_zeros(shape), slab.new_zeros(shape)
        self.add(2 * before.numel() * before.element_size())
        return torch.cat([before, slab, after], dim=batch_axis)


def not_splittable_reason(model: nn.Module, traced_sample_shape: tuple[int, ...]) -> str | None:
    """Why ``model`` cannot be split spatially on samples of this shape; None when it can."""
    spatial_dims = len(traced_sample_shape) - 1
    convs = [m for m in model.modules() if isinstance(m, CONV_TYPES)]
    if spatial_dims < 1 or not any(len(m.kernel_size) == spatial_dims for m in convs):
        return "it has no convolutions over the sample's spatial axes"
    attention = [type(m).__name__ for m in model.modules()
                 if isinstance(m, nn.MultiheadAttention) or "Attention" in type(m).__name__]
    if attention:
        return f"its attention ({attention[0]}) mixes every position of the sample"
    return None


def split_axis(traced_sample_shape: tuple[int, ...]) -> int:
    """Index (in the channels-first sample shape) of the longest spatial axis, first on ties."""
    spatial = traced_sample_shape[1:]
    return 1 + spatial.index(max(spatial))


def slab_length(length: int, parts: int) -> int:
    """The largest rank's share of an axis of ``length``, rounded up to a multiple of the
    axis's power-of-two alignment (at most ``MAX_ALIGNMENT``, at most the share itself)."""
    share = -(-length // parts)
    alignment = min(math.gcd(length, MAX_ALIGNMENT), 1 << (share.bit_length() - 1))
    return -(-share // alignment) * alignment


def slab_shape(traced_sample_shape: tuple[int, ...], parts: int) -> tuple[int, ...]:
    axis = split_axis(traced_sample_shape)
    shape = list(traced_sample_shape)
    shape[axis] = slab_length(shape[axis], parts)
    return tuple(shape)


def apply_halo_exchange(model: nn.Module, batch_axis: int, pad: PadWithHalos) -> list[str]:
    """Make every padded conv/pool along ``batch_axis`` (an axis of the batch tensor) take
    its padding rows as halos from the neighbours (``pad``), in place; return the layers
    changed."""
    changed = []
    for name, module in model.named_modules():
        if not isinstance(module, (*CONV_TYPES, *_POOL_TYPES)) or isinstance(
                module, tuple(CONV_TYPES[3:])):   # transposed convs: their padding crops
            continue
        kernel_axis = batch_axis - 2
        padding = _padding_tuple(module)
        if padding is None or kernel_axis >= len(padding) or padding[kernel_axis] == 0:
            continue
        rows = padding[kernel_axis]
        padding[kernel_axis] = 0
        _set_padding(module, tuple(padding))
        module.register_forward_pre_hook(_halo_hook(batch_axis, rows, pad))
        changed.append(name)
    return changed


def _halo_hook(batch_axis: int, rows: int, pad: PadWithHalos):
    def add_halos(_module: nn.Module, args: tuple) -> tuple:
        return (pad(args[0], batch_axis, rows), *args[1:])
    return add_halos


def _padding_tuple(module: nn.Module) -> list[int] | None:
    kernel = module.kernel_size
    dims = len(kernel) if isinstance(kernel, tuple) else _pool_dims(module)
    padding = module.padding
    if isinstance(padding, str):
        if padding == "valid":
            return None
        dilation = module.dilation
        return [d * (k - 1) // 2 for k, d in zip(kernel, dilation, strict=True)]
    return list(padding) if isinstance(padding, tuple) else [padding] * dims


def _pool_dims(module: nn.Module) -> int:
    return int(type(module).__name__[-2])


def _set_padding(module: nn.Module, padding: tuple[int, ...]) -> None:
    module.padding = padding
    set_padding_mode_cache(module, padding)
