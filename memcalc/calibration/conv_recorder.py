"""Every convolution of a real CUDA step as cuDNN runs it, with the bytes each call holds
beyond its inputs and outputs (workspaces and internal temporaries).

A backward convolution is run as its two cuDNN calls, data gradient then weight gradient,
the order ``cudnn_convolution_backward`` uses, so each call's transient is measured alone.
The counters are the caching allocator's (``torch.cuda.memory_stats``): block bytes, so a
transient is rounded as the allocator rounds it.
"""

from __future__ import annotations

import torch

from memcalc.trace._torch_internals import OpInterceptor, conv_backend_name
from memcalc.trace.cudnn_workspace import ConvCall, ConvKind, MeasuredConv
from memcalc.trace.workspaces import ConvGeometry, conv_call

_ATEN = torch.ops.aten
_CUDNN = torch.backends.cudnn


def _cudnn_fwd(call):
    return call()


def _cudnn_dgrad(call):
    return call()


def _cudnn_wgrad(call):
    return call()


# The Python frame each kind's allocations carry in the allocator's history.
FRAME_OF_KIND = {ConvKind.FORWARD: "_cudnn_fwd", ConvKind.DGRAD: "_cudnn_dgrad",
                 ConvKind.WGRAD: "_cudnn_wgrad"}
_RUNNER = {ConvKind.FORWARD: _cudnn_fwd, ConvKind.DGRAD: _cudnn_dgrad,
           ConvKind.WGRAD: _cudnn_wgrad}


class ConvRecorder:
    """Records a ``MeasuredConv`` per cuDNN call while active (``with recorder:``)."""

    def __init__(self) -> None:
        self.records: list[MeasuredConv] = []
        self.iteration = 0
        self._seen: set[ConvCall] = set()
        self._mode = OpInterceptor(self._handle)

    def __enter__(self) -> ConvRecorder:
        self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._mode.__exit__(*exc)

    def _handle(self, func, args, kwargs):
        if func is _ATEN.convolution.default:
            return self._forward(func, args, kwargs)
        if func is _ATEN.convolution_backward.default:
            return self._backward(func, args, kwargs)
        return func(*args, **kwargs)

    def _forward(self, func, args, kwargs):
        x, w, bias = args[:3]
        geometry = ConvGeometry.of_forward(args)
        output, call = self._measure(ConvKind.FORWARD, lambda: func(*args, **kwargs))
        self._add(call, ConvKind.FORWARD, (x, w, output), geometry,
                  conv_backend_name(x, w, bias, geometry))
        return output

    def _backward(self, func, args, kwargs):
        grad_out, x, w = args[:3]
        geometry = ConvGeometry.of_backward(args)
        mask = list(args[10])
        backend = conv_backend_name(x, w, None, geometry)
        results: list = [None, None, None]
        if mask[0]:
            grads, call = self._measure(ConvKind.DGRAD, lambda: func(*args[:10], [True, False, False]))
            results[0] = grads[0]
            self._add(call, ConvKind.DGRAD, (x, w, grad_out), geometry, backend)
        if mask[1] or mask[2]:
            grads, call = self._measure(ConvKind.WGRAD,
                                        lambda: func(*args[:10], [False, mask[1], mask[2]]))
            results[1], results[2] = grads[1], grads[2]
            if mask[1]:
                self._add(call, ConvKind.WGRAD, (x, w, grad_out), geometry, backend)
        return tuple(results)

    def _measure(self, kind: ConvKind, call):
        before = torch.cuda.memory_stats()
        torch.cuda.reset_peak_memory_stats()
        output = _RUNNER[kind](call)
        after = torch.cuda.memory_stats()
        return output, _transients(before, after)

    def _add(self, measured: dict, kind: ConvKind, tensors: tuple, geometry: ConvGeometry,
             backend: str) -> None:
        """``tensors``: input, weight and output (the output gradient in backward)."""
        call = conv_call(kind, *tensors, geometry, tf32=_CUDNN.allow_tf32,
                         benchmark=_CUDNN.benchmark)
        first = call not in self._seen
        self._seen.add(call)
        self.records.append(MeasuredConv(call=call, backend=backend, iteration=self.iteration,
                                         first_call=first, **measured))


def _transients(before: dict, after: dict) -> dict:
    """Bytes a call held beyond what it returned: the peak above the bytes live after it,
    all freed bytes, how many blocks, and how much the reserved pool grew."""
    key = "allocated_bytes.all."
    return dict(
        transient_peak_bytes=after[key + "peak"] - after[key + "current"],
        transient_total_bytes=after[key + "freed"] - before[key + "freed"],
        transient_blocks=after["allocation.all.freed"] - before["allocation.all.freed"],
        reserved_growth_bytes=(after["reserved_bytes.all.current"]
                               - before["reserved_bytes.all.current"]),
        alloc_retries=after.get("num_alloc_retries", 0) - before.get("num_alloc_retries", 0),
    )

