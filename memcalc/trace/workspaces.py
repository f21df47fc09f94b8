"""cuDNN workspaces put into the traced event sequence, where a CUDA step allocates them.

The trace runs CPU kernels, which allocate no cuDNN workspace. At each traced convolution
this inserts what cuDNN would allocate through the caching allocator, sized by the
environment profile's ``WorkspaceModel``: forward, output then workspace; backward, the
input gradient then its workspace, the weight gradient then its workspace
(``cudnn_convolution_backward``'s order). With ``cudnn.benchmark`` the first call of each
signature first allocates the buffer the plan search times candidates in, after which
PyTorch empties the allocator's cache (``Conv_v8.cpp``, ``run_single_conv``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch

from memcalc.trace.cudnn_workspace import ConvCall, ConvKind, WorkspaceModel

_CONV = "convolution"
_CONV_BACKWARD = "convolution_backward"


def _channels_last(tensor: torch.Tensor) -> bool:
    formats = {4: torch.channels_last, 5: torch.channels_last_3d}
    memory_format = formats.get(tensor.dim())
    return bool(memory_format and not tensor.is_contiguous()
                and tensor.is_contiguous(memory_format=memory_format))


class ConvGeometry(NamedTuple):
    """A convolution's arguments besides its tensors, as ``aten.convolution`` takes them."""

    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    transposed: bool
    output_padding: tuple[int, ...]
    groups: int

    @classmethod
    def of_forward(cls, args: tuple) -> ConvGeometry:
        """From ``convolution(x, weight, bias, stride, padding, dilation, transposed,
        output_padding, groups)``."""
        return cls(*args[3:9])

    @classmethod
    def of_backward(cls, args: tuple) -> ConvGeometry:
        """From ``convolution_backward(grad_output, x, weight, bias_sizes, stride, padding,
        dilation, transposed, output_padding, groups, output_mask)``."""
        return cls(*args[4:10])


def conv_call(kind: ConvKind, x: torch.Tensor, weight: torch.Tensor, y: torch.Tensor,
              geometry: ConvGeometry, *, tf32: bool, benchmark: bool) -> ConvCall:
    """The cuDNN call a convolution op makes, from its tensors (real or fake) and arguments;
    ``y`` is the forward's output (the output gradient in backward)."""
    return ConvCall(kind=kind, input_shape=tuple(x.shape), weight_shape=tuple(weight.shape),
                    output_shape=tuple(y.shape), stride=tuple(geometry.stride),
                    padding=tuple(geometry.padding), dilation=tuple(geometry.dilation),
                    groups=geometry.groups, transposed=bool(geometry.transposed),
                    dtype=str(x.dtype).removeprefix("torch."), channels_last=_channels_last(x),
                    tf32=tf32, benchmark=benchmark)


@dataclass(frozen=True)
class WorkspaceSize:
    """How a workspace's bytes follow from its call: the rule of ``model`` for ``call`` (the
    plan search's buffer with ``find``). A line through two traces
    (``memcalc.trace.affine_trace``) recomputes it at another batch, where the rule, capped
    and rounded, is not affine in the batch as the call's tensors are."""

    call: ConvCall
    model: WorkspaceModel
    find: bool = False

    @property
    def nbytes(self) -> int:
        return (self.model.find_bytes(self.call) if self.find
                else self.model.workspace_bytes(self.call))


class ConvWorkspaces:
    """Op hook for ``StorageWatcher``: watches a convolution's outputs in cuDNN's order and
    adds each call's workspace as a transient, optional allocation."""

    def __init__(self, model: WorkspaceModel,
                 transient: Callable[[int, WorkspaceSize], None],
                 empty_cache: Callable[[], None], *, benchmark: bool, tf32: bool) -> None:
        self._model, self._transient, self._empty_cache = model, transient, empty_cache
        self._benchmark, self._tf32 = benchmark, tf32
        self._searched: set[ConvCall] = set()
        self.calls = 0

    def __call__(self, name: str, args: tuple, outputs, watch: Callable) -> bool:
        """Handle one op; False when it is not a convolution (the watcher goes on as usual)."""
        if name == _CONV:
            watch(outputs)
            x, weight = args[:2]
            self._workspace(ConvKind.FORWARD, x, weight, outputs, ConvGeometry.of_forward(args))
            return True
        if name != _CONV_BACKWARD:
            return False
        grad_output, x, weight = args[:3]
        geometry = ConvGeometry.of_backward(args)
        grad_input, grad_weight, grad_bias = outputs
        for kind, grad in ((ConvKind.DGRAD, grad_input), (ConvKind.WGRAD, grad_weight)):
            if grad is not None:
                watch(grad)
                self._workspace(kind, x, weight, grad_output, geometry)
        if grad_bias is not None:
            watch(grad_bias)
        return True

    def _workspace(self, kind: ConvKind, x, weight, y, geometry: ConvGeometry) -> None:
        call = conv_call(kind, x, weight, y, geometry, tf32=self._tf32, benchmark=self._benchmark)
        self.calls += 1
        if self._benchmark and call not in self._searched:
            self._searched.add(call)
            found = WorkspaceSize(call, self._model, find=True)
            self._transient(found.nbytes, found)
            self._empty_cache()
        size = WorkspaceSize(call, self._model)
        self._transient(size.nbytes, size)
