"""Activation offloading as ``torch.autograd.graph.save_on_cpu`` does it, for the trace.

Every tensor autograd saves in forward is copied to host memory and dropped from the GPU
(when nothing else holds it); backward copies it back into a fresh GPU tensor. In the trace
the pack hook keeps only the size, strides and dtype, so the device copy dies as it would
on the GPU and the unpack allocates the reloaded copy; the bytes packed per iteration are the
pinned host memory the offload needs.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch


@dataclass
class OffloadCounter:
    """Bytes sent to the host in the current iteration and the most in any iteration."""

    current_bytes: int = 0
    peak_bytes: int = 0
    _packed: list = field(default_factory=list)

    def start_iteration(self) -> None:
        self.current_bytes = 0

    def hooks(self) -> contextlib.AbstractContextManager:
        def pack(tensor: torch.Tensor):
            nbytes = tensor.numel() * tensor.element_size()   # .to("cpu") copies the view
            self.current_bytes += nbytes
            self.peak_bytes = max(self.peak_bytes, self.current_bytes)
            return tensor.size(), tensor.stride(), tensor.dtype, tensor.requires_grad

        def unpack(packed) -> torch.Tensor:
            size, stride, dtype, _ = packed
            return torch.empty_strided(size, stride, dtype=dtype)

        return torch.autograd.graph.saved_tensors_hooks(pack, unpack)
