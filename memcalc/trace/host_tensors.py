"""Tensors a traced step makes in host RAM beside the GPU ones: a sliding window's output
aggregated on the CPU and the windows gathered from a volume there (MONAI's ``device`` and
``inputs``); the volume itself is the batch, which the host estimate holds already.

In the trace such tensors are made on the ``meta`` device (``HOST_DEVICE``), which the storage
watcher leaves out of the GPU ledger; this counter follows them instead, from the ops that make
them to their garbage collection, and keeps the peak of their live bytes.
"""

from __future__ import annotations

import weakref

import torch

from memcalc.model.sliding_window import HOST_DEVICE
from memcalc.trace._torch_internals import OpInterceptor, tree_flatten


class LiveStorageBytes:
    """Live and peak bytes of a set of storages, each counted once until it dies."""

    def __init__(self) -> None:
        self.live_bytes = 0
        self.peak_bytes = 0
        self._known: dict[int, tuple[int, weakref.ref]] = {}

    def holds(self, storage: torch.UntypedStorage) -> bool:
        return id(storage) in self._known

    def add(self, storage: torch.UntypedStorage, counted: bool = True) -> None:
        """Know this storage (views of it are not new); ``counted`` False: leave it out of
        the bytes."""
        key = id(storage)
        if key in self._known or storage.nbytes() == 0:
            return
        nbytes = storage.nbytes() if counted else 0
        self._known[key] = (nbytes, weakref.ref(storage, lambda _ref, key=key: self._died(key)))
        self.live_bytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)

    def _died(self, key: int) -> None:
        nbytes, _ = self._known.pop(key, (0, None))
        self.live_bytes -= nbytes


class HostTensorCounter(OpInterceptor):
    """Live and peak bytes of the ``HOST_DEVICE`` storages the step makes (each once)."""

    def __init__(self) -> None:
        super().__init__(self._op)
        self.storages = LiveStorageBytes()

    @property
    def peak_bytes(self) -> int:
        return self.storages.peak_bytes

    def watch(self, tensors, counted: bool = True) -> None:
        """Count these tensors' host storages, if not yet known; ``counted`` False: know
        them (views of them are not new) but leave them out of the bytes."""
        for tensor in tensors:
            if isinstance(tensor, torch.Tensor) and tensor.device == HOST_DEVICE:
                self.storages.add(tensor.untyped_storage(), counted)

    def _op(self, func, args, kwargs):
        out = func(*args, **kwargs)
        self.watch(tree_flatten(out)[0])
        return out
