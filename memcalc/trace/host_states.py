"""FSDP2's CPU offload (``CPUOffloadPolicy``) in the trace: which storages live in host RAM.

The trace runs on fake CPU tensors, where FSDP2's host and GPU are one device and its copies
between them (``Tensor.to``) copy nothing. ``HostStates`` places the storages as the GPU job
does: the sharded parameters start on the host; an op's outputs are on the host when one of
its inputs is (the optimizer's state and update, gradient clipping); FSDP2's two copies
across — each parameter shard to the GPU for its unit's all-gather, each reduced gradient
shard back to the host — are made real copies on their side (``OffloadCopies``). Host
storages stay out of the GPU ledger; their live bytes and peak are counted here.

Known limitations: pinned memory is not modelled (the trace offloads with
``pin_memory=False``; CUDA's host allocator rounds pinned blocks up to powers of two and
caches them); factories the optimizer calls without a tensor input (a step count made by
``torch.tensor``) count on the GPU.
"""

from __future__ import annotations

import contextlib
import sys
import threading

import torch

from memcalc.errors import TraceError
from memcalc.trace._torch_internals import fsdp_offload_copy_sites, tree_flatten
from memcalc.trace.host_tensors import LiveStorageBytes


class HostStates(LiveStorageBytes):
    """The storages of an FSDP2 rank that live in host RAM under CPU offload."""

    def __init__(self) -> None:
        super().__init__()
        self._crossing: bool | None = None

    def hold(self, tensors) -> None:
        """These tensors' storages are in host RAM (the offloaded parameter shards)."""
        for tensor in tensors:
            self.add(tensor.untyped_storage())

    def outputs_on_host(self, args, kwargs) -> bool:
        """Where an op's new storages go: the side of a copy across, else the host when an
        input tensor is there (ops run on their inputs' device)."""
        if self._crossing is not None:
            return self._crossing
        return any(isinstance(value, torch.Tensor) and self.holds(value.untyped_storage())
                   for value in tree_flatten((args, kwargs))[0])

    @contextlib.contextmanager
    def crossing(self, to_host: bool):
        self._crossing = to_host
        try:
            yield
        finally:
            self._crossing = None

    def copies(self) -> OffloadCopies:
        """What makes FSDP2's copies across real (entered around the traced step)."""
        sites = fsdp_offload_copy_sites()
        if not sites:
            raise TraceError("--cpu-offload: this torch's FSDP2 has none of the copies "
                             "memcalc follows (FSDPParam.all_gather_inputs, foreach_reduce); "
                             "use torch 2.6 or newer")
        return OffloadCopies(self, sites)


class OffloadCopies:
    """While entered, ``Tensor.to`` called by FSDP2's all-gather copy-in or its gradient
    reduce on this thread is a copy to the other side (from the host to the GPU, or back),
    where the CPU trace would return the tensor itself. ``Tensor.to`` is wrapped, not
    intercepted by a torch-function mode: the autograd engine runs FSDP2's backward hooks
    without the caller's modes. Other threads and other callers get the original; it is
    restored on every exit path."""

    _lock = threading.Lock()
    _active: dict[int, HostStates] = {}
    _original = None

    def __init__(self, states: HostStates, sites: frozenset) -> None:
        self.states, self.sites, self.thread = states, sites, threading.get_ident()

    def __enter__(self) -> None:
        cls = type(self)
        with cls._lock:
            if not cls._active:
                cls._original = original = torch.Tensor.to
                sites = self.sites

                def to(tensor, *args, **kwargs):
                    states = cls._active.get(threading.get_ident())
                    if states is None or sys._getframe(1).f_code not in sites:
                        return original(tensor, *args, **kwargs)
                    with states.crossing(not states.holds(tensor.untyped_storage())):
                        return original(tensor, *args, **{**kwargs, "copy": True})

                torch.Tensor.to = to
            cls._active[self.thread] = self.states

    def __exit__(self, *exc) -> None:
        cls = type(self)
        with cls._lock:
            cls._active.pop(self.thread, None)
            if not cls._active and cls._original is not None:
                torch.Tensor.to = cls._original
