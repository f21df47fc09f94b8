"""Build a user's model once with its parameters and buffers on ``meta``.

Constructors often compute with tensors: timm's drop-path schedules
(``[x.item() for x in torch.linspace(...)]``), torchvision RegNet's block widths
(``.tolist()``), MONAI SwinUNETR's ``.item()``. Under ``torch.device("meta")`` those fail (meta
tensors have no values), so the build runs on the CPU for real, as accelerate's
``init_empty_weights`` does, and only what the module registers goes to ``meta``:

- every parameter and buffer is moved to ``meta`` as it is registered (tied weights assigned
  later keep their identity: a meta tensor is registered as it is);
- a tensor factory asked for more than ``REAL_FACTORY_LIMIT_BYTES`` makes a meta tensor, so a
  constructor that allocates a large temporary never fills the host's RAM;
- ``cuda`` devices become ``cpu`` (``.cuda()``, ``.to("cuda")``, ``device="cuda"``) and a
  module's ``.to(device)`` / ``.cuda()`` leave its meta states where they are, so a builder
  written for a GPU node builds on a machine without CUDA.

Known limitations: a constructor that reads values of a tensor larger than the factory limit
reads a meta tensor and fails; the error names it.
"""

from __future__ import annotations

import math
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

REAL_FACTORY_LIMIT_BYTES = 64 << 20
"""Largest tensor a constructor may allocate for real; larger ones are made on ``meta``."""

_FACTORIES = frozenset({torch.empty, torch.zeros, torch.ones, torch.full, torch.rand,
                        torch.randn, torch.empty_strided, torch.eye})
"""Factories whose leading positional arguments are the size."""


def _is_cuda(device: Any) -> bool:
    if isinstance(device, int) and not isinstance(device, bool):
        return True
    if isinstance(device, (str, torch.device)):
        return torch.device(device).type == "cuda"
    return False


class _CpuConstruction(TorchFunctionMode):
    """Redirects ``cuda`` to ``cpu`` and sends large factory tensors to ``meta`` (unless
    ``large_on_meta`` is off: the real build)."""

    def __init__(self, large_on_meta: bool = True) -> None:
        super().__init__()
        self.large_on_meta = large_on_meta

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.cuda:
            return args[0]
        if _is_cuda(kwargs.get("device")):
            kwargs["device"] = "cpu"
        if func is torch.Tensor.to:
            args = _device_args_on_cpu(args, first=1)
        if (self.large_on_meta and func in _FACTORIES and kwargs.get("device") in (None, "cpu")
                and _large(args, kwargs)):
            kwargs["device"] = "meta"
        return func(*args, **kwargs)


def _device_args_on_cpu(args: tuple, first: int) -> tuple:
    """``.to(device, ...)``: a CUDA device at position ``first`` becomes ``cpu``."""
    if len(args) > first and _is_cuda(args[first]):
        return (*args[:first], "cpu", *args[first + 1:])
    return args


def _large(args: tuple, kwargs: dict) -> bool:
    """Whether a factory's size arguments ask for more than the real-allocation limit."""
    dims = args[0] if args and isinstance(args[0], (tuple, list, torch.Size)) else args
    if not dims or not all(isinstance(dim, int) for dim in dims):
        return False
    dtype = kwargs.get("dtype") or torch.get_default_dtype()
    return math.prod(dims) * dtype.itemsize > REAL_FACTORY_LIMIT_BYTES


def _meta_parameter(param: nn.Parameter) -> nn.Parameter:
    """A meta twin of ``param`` of its own class when that class allows, with its attributes
    (timm and Hugging Face tag parameters with flags read later)."""
    try:
        twin = type(param)(param.to("meta"), requires_grad=param.requires_grad)
    except Exception:  # a Parameter subclass with another constructor
        twin = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
    twin.__dict__.update(param.__dict__)
    return twin


class _Building(threading.local):
    """How many builds this thread is inside: the hooks act for these threads only. In a
    real build (``counting``) states stay where they are and their bytes are counted."""

    depth = 0
    counting = False
    counted = 0


_BUILDING = _Building()
_HOOKS_LOCK = threading.Lock()
_HOOKS: dict[str, Any] = {"users": 0, "originals": None}
"""The hooks are installed on ``nn.Module`` once for all threads building at once, and the
originals put back when the last one ends (threads that overlap used to restore each other's
hooks and leave them in place)."""


def _building() -> bool:
    return _BUILDING.depth > 0


def _install_hooks() -> tuple:
    register_parameter = nn.Module.register_parameter
    register_buffer = nn.Module.register_buffer
    module_cuda, module_to = nn.Module.cuda, nn.Module.to

    def parameter_on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        register_parameter(module, name, param)
        if _building() and param is not None and param.device.type != "meta":
            if _BUILDING.counting:
                _count(param)
            else:
                module._parameters[name] = _meta_parameter(param)

    def buffer_on_meta(module: nn.Module, name: str, tensor: torch.Tensor | None,
                       persistent: bool = True) -> None:
        register_buffer(module, name, tensor, persistent)
        if _building() and tensor is not None and tensor.device.type != "meta":
            if _BUILDING.counting:
                _count(tensor)
            else:
                module._buffers[name] = tensor.to("meta")

    def cuda_kept(module: nn.Module, device: Any = None) -> nn.Module:
        return module if _building() else module_cuda(module, device)

    def to_without_device(module: nn.Module, *args: Any, **kwargs: Any) -> nn.Module:
        """``Module.to``: states stay on meta, so only a dtype is applied."""
        if not _building():
            return module_to(module, *args, **kwargs)
        dtypes = [arg for arg in args if isinstance(arg, torch.dtype)]
        dtypes += [arg.dtype for arg in args if isinstance(arg, torch.Tensor)]
        dtype = kwargs.get("dtype") or (dtypes[0] if dtypes else None)
        return module_to(module, dtype) if dtype is not None else module

    nn.Module.register_parameter = parameter_on_meta
    nn.Module.register_buffer = buffer_on_meta
    nn.Module.cuda = cuda_kept
    nn.Module.to = to_without_device
    return register_parameter, register_buffer, module_cuda, module_to


@contextmanager
def _registrations_on_meta() -> Iterator[None]:
    """Parameters and buffers registered by this thread go to ``meta``; other threads'
    modules are built as usual meanwhile; ``nn.Module`` is as it was once no thread builds."""
    with _HOOKS_LOCK:
        if _HOOKS["users"] == 0:
            _HOOKS["originals"] = _install_hooks()
        _HOOKS["users"] += 1
    _BUILDING.depth += 1
    try:
        yield
    finally:
        _BUILDING.depth -= 1
        with _HOOKS_LOCK:
            _HOOKS["users"] -= 1
            if _HOOKS["users"] == 0:
                (nn.Module.register_parameter, nn.Module.register_buffer, nn.Module.cuda,
                 nn.Module.to) = _HOOKS["originals"]
                _HOOKS["originals"] = None


BUILD_FOR_REAL_LIMIT_BYTES = 1 << 30
"""Most parameter and buffer bytes a constructor may hold when it is built for real (its
constructor computes with its own layers: YOLO's stride probe)."""

_BUILT_FOR_REAL: weakref.WeakSet = weakref.WeakSet()


class BuildTooLargeError(RuntimeError):
    """A real build passed ``BUILD_FOR_REAL_LIMIT_BYTES`` (it was stopped there)."""


def _count(tensor: torch.Tensor) -> None:
    _BUILDING.counted += tensor.untyped_storage().nbytes()
    if _BUILDING.counted > BUILD_FOR_REAL_LIMIT_BYTES:
        raise BuildTooLargeError(
            f"its constructor runs its own layers (it needs real parameters) and its "
            f"parameters pass {BUILD_FOR_REAL_LIMIT_BYTES >> 20} MiB, too many to build for "
            "real; build the model without the probe (or give its builder a flag for it)")


def build_with_meta_states(factory: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
    """``factory(**kwargs)`` run on the CPU with every parameter and buffer on ``meta``.
    A constructor that computes with its own layers (a forward on zeros to find its strides,
    which fails with meta weights) is built again for real on the CPU, as long as its states
    stay within ``BUILD_FOR_REAL_LIMIT_BYTES`` (counted as they are registered, stopped
    there); ``built_for_real`` then says so."""
    try:
        with _registrations_on_meta(), _CpuConstruction():
            return factory(**kwargs)
    except Exception as error:  # the user's constructor
        if not _meta_refused(error):
            raise
    _BUILDING.counting, _BUILDING.counted = True, 0
    try:
        with _registrations_on_meta(), _CpuConstruction(large_on_meta=False):
            model = factory(**kwargs)
    finally:
        _BUILDING.counting, _BUILDING.counted = False, 0
    mark_built_for_real(model)
    return model


def _meta_refused(error: Exception) -> bool:
    """The error is about meta tensors (a user's exception may not even print)."""
    try:
        return "meta" in str(error)
    except Exception:  # its __str__ raised
        return False


def mark_built_for_real(model: Any) -> None:
    """Note that ``model`` (or its meta copy) was built for real."""
    if isinstance(model, nn.Module):
        _BUILT_FOR_REAL.add(model)


def built_for_real(model: nn.Module) -> bool:
    """``model`` came from a constructor that had to be built for real on the CPU."""
    return model in _BUILT_FOR_REAL


_COMPILED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def mark_compiled(model: nn.Module, names: list[str]) -> None:
    """Note that ``model`` is the eager twin of a model whose modules ``names`` were compiled
    with ``torch.compile`` (``""``: the whole model)."""
    _COMPILED[model] = tuple(names)


def compiled_names(model: nn.Module) -> tuple[str, ...]:
    """The compiled modules of the model ``model`` stands in for (empty: none)."""
    return _COMPILED.get(model, ())
