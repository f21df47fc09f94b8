"""Activation offloading as ``torch.autograd.graph.save_on_cpu`` does it, for the trace.

Every tensor autograd saves in forward is copied to host memory and dropped from the GPU
(when nothing else holds it); backward copies it back into a fresh GPU tensor. In the trace
the pack hook keeps only the size, strides and dtype, so the device copy dies as it would
on the GPU and the unpack allocates the reloaded copy; the bytes packed per iteration are the
pinned host memory the offload needs.
"""

from __future__ import annotations

import contextlib

import torch

from memcalc.trace.ledger import IterationBytes


class OffloadCounter(IterationBytes):
    """Bytes sent to the host in the current iteration and the most in any iteration."""

    def hooks(self) -> contextlib.AbstractContextManager:
        def pack(tensor: torch.Tensor):
            self.add(tensor.numel() * tensor.element_size())   # .to("cpu") copies the view
            return tensor.size(), tensor.stride(), tensor.dtype, tensor.requires_grad

        def unpack(packed) -> torch.Tensor:
            size, stride, dtype, _ = packed
            return torch.empty_strided(size, stride, dtype=dtype)

        return torch.autograd.graph.saved_tensors_hooks(pack, unpack)
