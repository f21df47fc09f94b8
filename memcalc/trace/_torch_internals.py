"""The only module that touches private PyTorch APIs.

Used here (checked against torch 2.3 – 2.14):
- ``torch._subclasses.fake_tensor.FakeTensorMode`` and its exceptions: tensors with shapes,
  dtypes and storages but no data, so a step of any size runs without allocating it.
- ``torch.utils._python_dispatch.TorchDispatchMode``: sees every ATen op and its outputs.
- ``torch.utils.weak.WeakIdKeyDictionary``: identity-keyed map of live storages.
- ``OpOverload._schema``: which arguments an op writes into (``written_tensors``).
- the logger ``torch._subclasses.fake_tensor``: it logs a full traceback at ERROR level
  whenever a meta kernel raises, even when the caller catches the error; muted during a trace.
- ``torch._grouped_mm`` (torch ≥ 2.8, MoE experts in transformers 5): its meta kernel accepts
  only bf16 (torch 2.8 – 2.14) while the CPU and CUDA kernels take fp32 and fp16 too; memcalc
  supplies its own shape rule (``FAKE_KERNELS``). ``_c10d_functional::wait_tensor``'s meta
  kernel returns a new tensor where the eager one returns its input: memcalc returns the input.
- ``torch.cuda.memory._record_memory_history`` / ``_snapshot`` (real GPUs only, torch ≥ 2.1):
  the caching allocator's own trace of allocations and frees, for calibration.
- ``torch.testing._internal.distributed.fake_pg.FakeStore`` (torch ≥ 2.2): the store of the
  ``fake`` process-group backend, whose collectives are no-ops, so one process can be one rank
  of an N-rank job (``fake_process_group``).
- ``torch.overrides._get_current_function_mode_stack``: the torch-function modes active now,
  entered again around a checkpoint's recomputation (the autograd engine clears them).
- ``torch._functorch.aot_autograd.aot_module_simplified``, ``torch._functorch.partitioners
  .min_cut_rematerialization_partition``, ``torch._inductor.decomposition.select_decomp_table``
  and ``torch.utils._python_dispatch._disable_current_modes`` (torch ≥ 2.1): a compiled step's
  joint graph and partition, captured with the watcher paused; ``OpOverload.tags`` /
  ``is_view`` / ``_schema`` and ``torch._dynamo.eval_frame.OptimizedModule`` (read from
  ``sys.modules``, never imported here): what ``torch.compile`` wrapped.
- ``TorchDispatchMode._should_skip_dynamo`` (torch 2.13 calls it when a mode class is
  made; older versions ignore it): the modes here return False, so torch does not wrap
  their ``__torch_dispatch__`` in ``torch._dynamo.disable`` (a small LLaMA's trace makes 8 %
  fewer Python calls without it). They call no compiled code, and torch skips compiling
  while a dispatch mode is on the stack anyway
  (``torch._dynamo.config.inline_torch_dispatch_torch_compile``).
- FSDP2's ``FSDPParam.all_gather_inputs`` and ``_fsdp_collectives.foreach_reduce`` (torch
  ≥ 2.6): the two places where ``CPUOffloadPolicy`` copies across host and GPU
  (``fsdp_offload_copy_sites``; ``memcalc.trace.host_states``).
- ``torch.UntypedStorage.resize_`` is not an ATen op (no dispatch mode sees it): FSDP2 frees
  and re-allocates its unsharded parameters with it (``_fsdp_param.alloc_storage``), so the
  watcher wraps it while it is active, as ``torch.distributed._tools.mem_tracker`` does.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import sys
import threading
import warnings
import weakref
from collections import Counter
from collections.abc import Callable, Iterator

import torch
from torch import nn
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensor,
    FakeTensorMode,
    UnsupportedOperatorException,
)
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten
from torch.utils.flop_counter import flop_registry
from torch.utils.weak import WeakIdKeyDictionary

from memcalc.trace.kernels import Kernel, kernel_class

UNSUPPORTED_OPERATOR = UnsupportedOperatorException
"""Raised for an op that has no fake (meta) kernel, such as a custom op."""

# Raised by fake tensors when an op needs real values (``.item()``, nonzero, custom ops).
FAKE_TENSOR_FAILURES: tuple[type[BaseException], ...] = (
    DataDependentOutputException,
    DynamicOutputShapeException,
    UnsupportedOperatorException,
)

DATA_DEPENDENT_FAILURES: tuple[type[BaseException], ...] = (
    DataDependentOutputException,
    DynamicOutputShapeException,
)
"""Raised by fake tensors for an output whose size or value depends on the data."""

_FAKE_TENSOR_LOGGER = "torch._subclasses.fake_tensor"


@contextlib.contextmanager
def quiet_fake_tensor_logger() -> Iterator[None]:
    """Drop the ERROR records (with their tracebacks) torch's fake-tensor logger writes when a
    meta kernel fails (``log.exception`` in ``FakeTensorMode._dispatch_impl``): the trace turns
    the failure into one TraceError line. The logger is as it was afterwards."""
    logger = logging.getLogger(_FAKE_TENSOR_LOGGER)
    mute = _BelowError()
    logger.addFilter(mute)
    try:
        yield
    finally:
        logger.removeFilter(mute)


class _BelowError(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno < logging.ERROR


METADATA_OPS = frozenset({torch.ops.prim.device.default})
"""Ops that only read a tensor's metadata: no storage, no FLOPs, nothing to bound. Asked for
``.device`` of every fake tensor from C++ (the autograd engine, the optimizers' foreach
grouping), they are about two thirds of the ops a trace dispatches: the modes here pass them
straight on, and the first of them to see one on a fake tensor answers it (``fake_device``)."""
_DEVICE = torch.ops.prim.device.default


def fake_device(func, args) -> torch.device | None:
    """``prim.device`` of a fake tensor answered as ``FakeTensor.__torch_dispatch__`` answers
    it (torch 2.3–2.13), so that the modes below and the fake mode's own dispatch are not
    entered for it; None for any other op or tensor."""
    if func is not _DEVICE or type(args[0]) is not FakeTensor:
        return None
    tensor = args[0]
    return torch.device("meta") if tensor.fake_mode.in_kernel_invocation else tensor.fake_device


class _PlainDispatchMode(TorchDispatchMode):
    """A dispatch mode whose ``__torch_dispatch__`` torch leaves unwrapped (see above)."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False


class OpInterceptor(_PlainDispatchMode):
    """Hands every ATen op but ``METADATA_OPS`` to ``handler(func, args, kwargs)``, which must
    call ``func`` itself (ops the handler makes are not intercepted again)."""

    def __init__(self, handler: Callable) -> None:
        super().__init__()
        self._handler = handler

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        device = fake_device(func, args)
        if device is not None:
            return device
        if _wrapper_subclass(types):
            return NotImplemented
        if func in METADATA_OPS:
            return func(*args, **(kwargs or {}))
        return self._handler(func, args, kwargs or {})


def _wrapper_subclass(types) -> bool:
    """An op on a tensor subclass with its own ``__torch_dispatch__`` other than the fake
    tensor (a DTensor of a tensor-parallel or FSDP2 job): a mode returns NotImplemented so
    that the subclass runs first and the mode then sees the ops on its local tensors, where
    the storages are (as ``mem_tracker`` does). Plain subclasses (``nn.Parameter``) have none."""
    return any(kind is not FakeTensor and _dispatch_of(kind) is not _TENSOR_DISPATCH
               for kind in types)


def _dispatch_of(kind: type):
    handler = getattr(kind, "__torch_dispatch__", None)
    return getattr(handler, "__func__", handler)


_TENSOR_DISPATCH = _dispatch_of(torch.Tensor)


def start_cuda_allocation_history(max_entries: int = 1_000_000) -> None:
    """Record every CUDA caching-allocator event with its Python stack (real GPU only)."""
    torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python",
                                             max_entries=max_entries)


def stop_cuda_allocation_history() -> list[dict]:
    """The recorded events of device 0 (``action``, ``addr``, ``size``, ``frames``), then stop."""
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    traces = snapshot.get("device_traces") or [[]]
    return list(traces[torch.cuda.current_device()])


def conv_backend_name(x, weight, bias, geometry) -> str:
    """The kernel family ATen picks for a convolution (``Cudnn``, ``CudaDepthwise2d``...);
    ``geometry``: stride, padding, dilation, transposed, output_padding, groups."""
    try:
        backend = torch._C._select_conv_backend(x, weight, bias, *geometry, None)
    except Exception:  # private API: absent or changed in this torch build
        return "unknown"
    return str(backend).rsplit(".", 1)[-1]


def _grouped_mm_output(mat_a: torch.Tensor, mat_b: torch.Tensor,
                       offs: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                       out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``aten::_grouped_mm`` for any floating dtype: 2D x 3D (MoE forward, grouped by
    ``offs``) -> (M, N); 3D x 2D -> (M, N); 2D x 2D (weight gradients) -> (groups, M, N);
    3D x 3D -> batched. The last dimension's stride is padded to 16 bytes as ATen's
    ``create_grouped_gemm_output_tensor`` does (GroupedMMUtils.h; a real CPU run of
    (10, 8) x (3, 8, 6) gives strides (8, 1))."""
    if mat_a.dtype != mat_b.dtype or not mat_a.is_floating_point():
        raise RuntimeError(f"_grouped_mm needs two floating operands of one dtype, got "
                           f"{mat_a.dtype} and {mat_b.dtype}")
    shape = {
        (2, 2): lambda: [offs.size(0), mat_a.size(0), mat_b.size(1)],
        (2, 3): lambda: [mat_a.size(0), mat_b.size(-1)],
        (3, 2): lambda: [mat_a.size(1), mat_b.size(1)],
        (3, 3): lambda: [mat_a.size(0), mat_a.size(1), mat_b.size(-1)],
    }[(mat_a.dim(), mat_b.dim())]()
    dtype = out_dtype or mat_a.dtype
    alignment = max(1, 16 // dtype.itemsize)
    row = -(-shape[-1] // alignment) * alignment
    strides = [1, row] if len(shape) == 2 else [1, row, shape[1] * row]
    return torch.empty_strided(shape, strides[::-1], dtype=dtype, device=mat_a.device)


def _waited(tensor: torch.Tensor, *args) -> torch.Tensor:
    """``_c10d_functional::wait_tensor``: its eager kernel hands back the tensor it waited
    for, its meta kernel (``funcol._wait_tensor_meta``) a new ``empty_like`` of it, which
    would count every functional collective's result twice while both live (tensor
    parallelism's gathers: a plain-TP head's whole logits)."""
    return tensor


FAKE_KERNELS: dict[str, Callable] = {"aten::_grouped_mm": _grouped_mm_output,
                                     "_c10d_functional::wait_tensor": _waited}
"""Rules memcalc runs instead of torch's fake kernel, by op name (``func.name()``): where the
fake kernel is too narrow (``_grouped_mm``) or allocates what the eager kernel does not
(``wait_tensor``)."""


_WRITTEN_ARGUMENTS: dict = {}


def written_tensors(func, args, kwargs) -> list[torch.Tensor]:
    """The tensors an ATen op writes into (arguments its schema marks ``Tensor(a!)``, such as
    ``self`` of ``index_put_`` or ``out``); read from ``OpOverload._schema``, cached per op."""
    if func not in _WRITTEN_ARGUMENTS:
        _WRITTEN_ARGUMENTS[func] = tuple(
            (position, argument.name) for position, argument in enumerate(func._schema.arguments)
            if argument.alias_info is not None and argument.alias_info.is_write)
    written = []
    for position, name in _WRITTEN_ARGUMENTS[func]:
        value = args[position] if position < len(args) else kwargs.get(name)
        written.extend(value if isinstance(value, (list, tuple)) else [value])
    return [tensor for tensor in written if isinstance(tensor, torch.Tensor)]


def lifted_number(tensor: torch.Tensor) -> bool | int | float | None:
    """The value of the real one-element tensor a fake one was lifted from (a Python number
    the fake mode keeps beside its fake as ``FakeTensor.constant``), read with the modes
    off; None for anything else."""
    constant = getattr(tensor, "constant", None) if isinstance(tensor, FakeTensor) else None
    if constant is None or constant.numel() != 1:
        return None
    with dispatch_modes_paused():
        return constant.item()


def is_fake_tensor(tensor: torch.Tensor) -> bool:
    """A fake tensor of a trace (its kernels are meta functions, which accept what CPU
    kernels may refuse, such as softmax's half_to_float)."""
    return isinstance(tensor, FakeTensor)


def fake_cpu_mode() -> FakeTensorMode:
    """A fake-tensor mode that accepts the meta-device model as input to ``to_empty``."""
    return FakeTensorMode(allow_non_fake_inputs=True)


class StorageWatcher(_PlainDispatchMode):
    """Reports every storage the first time it appears as an op output, and its death.

    ``on_new(storage)`` is called once per storage; ``on_free(token)`` when the storage is
    garbage collected, with the token ``on_new`` returned. ``on_new(storage, True)`` is asked
    for a token of an empty storage that ``watch`` is told to count (``empty_too``).
    """

    def __init__(self, on_new: Callable[[torch.UntypedStorage], object],
                 on_free: Callable[[object], None], op_hook: Callable | None = None,
                 host=None) -> None:
        super().__init__()
        self._on_new, self._on_free, self._op_hook = on_new, on_free, op_hook
        self._host = host
        """``memcalc.trace.host_states.HostStates`` of a rank offloading to the CPU: its
        storages, and the new ones it places on the host, are not the device's."""
        self._known: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._refs: list[weakref.ref] = []
        self.op_names: set[str] = set()

    def watch(self, tensor: torch.Tensor, empty_too: bool = False) -> object | None:
        """Start tracking ``tensor``'s storage if new; return its token (None if not the
        device's: a ``meta`` tensor is the host's, ``memcalc.trace.host_tensors``; or if empty,
        unless ``empty_too``: then ``on_new(storage, True)`` gives an empty storage a token)."""
        if tensor.device.type == "meta":
            return None
        storage = tensor.untyped_storage()
        if self._host is not None and self._host.holds(storage):
            return None
        if storage in self._known:
            holder = self._known[storage]
            if holder[0] is None and empty_too and storage.nbytes() == 0:
                holder[0] = self._on_new(storage, True)
            return holder[0]
        holder = [self._on_new(storage, True) if empty_too else self._on_new(storage)]
        self._known[storage] = holder
        self._refs.append(weakref.ref(storage, lambda _ref, holder=holder: self._died(holder)))
        return holder[0]

    def _died(self, holder: list) -> None:
        if holder[0] is not None:
            self._on_free(holder[0])
            holder[0] = None

    def token_of(self, tensor: torch.Tensor) -> object | None:
        holder = self._known.get(tensor.untyped_storage())
        return holder[0] if holder else None

    def _shape_inference(self, tensor: torch.Tensor) -> bool:
        """A meta tensor, or one DTensor makes at global shape to work out an op's output
        (``_sharding_prop``, under ``ShardingPropagator._fake_mode_lock``): not the rank's."""
        return tensor.device.type == "meta" or _SHAPE_INFERENCE.depth > 0

    def __enter__(self):
        self._resize = _TraceHooks(self)
        self._resize.__enter__()
        try:
            return super().__enter__()
        except BaseException:
            self._resize.__exit__(None, None, None)
            raise

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self._resize.__exit__(*exc)

    def resized(self, storage: torch.UntypedStorage, old_bytes: int) -> None:
        """A known storage changed size in place (FSDP2's unsharded parameters): its old bytes
        are freed and its new ones, if any, are a new record."""
        holder = self._known.get(storage)
        if holder is None or old_bytes == storage.nbytes():
            return
        self._died(holder)
        holder[0] = self._on_new(storage)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        """``op_hook(name, args, outputs, watch)`` may watch the outputs itself, in its own
        order, and return True; otherwise every output is watched in order."""
        device = fake_device(func, args)
        if device is not None:
            return device
        if _wrapper_subclass(types):
            return NotImplemented
        if func in METADATA_OPS:
            return func(*args, **(kwargs or {}))
        _refuse_real_inputs(func, args, kwargs)
        if torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is None:
            _refuse_before_real_allocation(func, args, kwargs)
        outputs = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        self.op_names.add(name)
        on_host = self._host is not None and self._host.outputs_on_host(args, kwargs)

        def watch_outputs(value) -> None:
            for tensor in _op_values((value,)):
                if isinstance(tensor, torch.Tensor) and not self._shape_inference(tensor):
                    _refuse_real_allocation(func, tensor)
                    if on_host and tensor.untyped_storage() not in self._known:
                        self._host.add(tensor.untyped_storage())
                    else:
                        self.watch(tensor)

        if self._op_hook is None or not self._op_hook(name, args, outputs, watch_outputs):
            watch_outputs(outputs)
        return outputs


class _ShapeInference(threading.local):
    """Counts, per thread, DTensor's sharding propagations in progress."""

    depth = 0


_SHAPE_INFERENCE = _ShapeInference()


class _InShapeInference:
    """Stands as ``ShardingPropagator._fake_mode_lock`` (a context manager that torch enters
    around running an op at global shape, ``nullcontext`` unless a test sets a lock) while a
    watcher is active: it enters the one it replaced and marks the thread meanwhile."""

    def __init__(self, replaced) -> None:
        self.replaced = replaced

    def __enter__(self):
        self.replaced.__enter__()
        _SHAPE_INFERENCE.depth += 1

    def __exit__(self, *exc):
        _SHAPE_INFERENCE.depth -= 1
        return self.replaced.__exit__(*exc)


def _sharding_propagator():
    """DTensor's ``ShardingPropagator`` when the process has loaded it (a distributed trace
    applied its wrappers first; other traces do not pay for importing it)."""
    module = sys.modules.get("torch.distributed.tensor._sharding_prop")
    propagator = getattr(module, "ShardingPropagator", None)
    return propagator if hasattr(propagator, "_fake_mode_lock") else None


class _TraceHooks:
    """Wraps ``torch.UntypedStorage.resize_`` and marks DTensor's shape inference while a
    watcher is active; other threads and other times call the originals. Restored on every
    exit path."""

    _lock = threading.Lock()
    _active: dict[int, StorageWatcher] = {}
    _original = None

    def __init__(self, watcher: StorageWatcher) -> None:
        self.watcher = watcher
        self.thread = threading.get_ident()

    def __enter__(self) -> None:
        cls = type(self)
        with cls._lock:
            if not cls._active:
                cls._original = torch.UntypedStorage.resize_
                original = cls._original

                def resize_(storage, size):
                    old = storage.nbytes()
                    result = original(storage, size)
                    watcher = cls._active.get(threading.get_ident())
                    if watcher is not None:
                        watcher.resized(storage, old)
                    return result

                torch.UntypedStorage.resize_ = resize_
                propagator = _sharding_propagator()
                if propagator is not None:
                    propagator._fake_mode_lock = _InShapeInference(propagator._fake_mode_lock)
            cls._active[self.thread] = self.watcher

    def __exit__(self, *exc) -> None:
        cls = type(self)
        with cls._lock:
            cls._active.pop(self.thread, None)
            if not cls._active and cls._original is not None:
                torch.UntypedStorage.resize_ = cls._original
                cls._original = None
                propagator = _sharding_propagator()
                if propagator is not None and isinstance(propagator._fake_mode_lock,
                                                         _InShapeInference):
                    propagator._fake_mode_lock = propagator._fake_mode_lock.replaced


REAL_ALLOCATION_LIMIT_BYTES = 16 << 20
"""Largest real (non-fake) tensor an op may produce during a trace: a bug that escapes the
fake mode fails fast instead of trying to allocate the step's hundreds of GiB."""


class RealAllocationError(RuntimeError):
    """An op produced a real tensor larger than ``REAL_ALLOCATION_LIMIT_BYTES`` while tracing."""


def _is_real(value) -> bool:
    return (isinstance(value, torch.Tensor) and not isinstance(value, FakeTensor)
            and value.device.type != "meta")


def _op_values(values) -> Iterator:
    """An ATen op's arguments or outputs, lists and tuples opened one level: its schema types
    (``Tensor``, ``Tensor[]``, ``Tensor?[]``, scalars) nest no deeper. Cheaper than pytree's
    ``tree_flatten``, which this runs instead of on every op of every trace."""
    for value in values:
        if isinstance(value, (list, tuple)):
            yield from value
        else:
            yield value


def _refuse_real_inputs(func, args, kwargs) -> None:
    """A real tensor over the limit reaching the trace (made from a numpy buffer, or held in
    a plain attribute) is memory the trace would not count: refused by name."""
    for value in _op_values((*args, *(kwargs or {}).values())):
        if _is_real(value) and value.untyped_storage().nbytes() > REAL_ALLOCATION_LIMIT_BYTES:
            raise RealAllocationError(
                f"{func} received a real {value.untyped_storage().nbytes():,}-byte tensor "
                f"{tuple(value.shape)} made outside the trace (a numpy buffer or a plain "
                "attribute); register it as a buffer or create it in forward so it is counted")


def _refuse_before_real_allocation(func, args, kwargs) -> None:
    """Outside the fake mode (the model left it), work out on meta tensors what the op would
    allocate, and refuse it before a real byte is taken when it is over the limit."""
    def to_meta(value):
        if _is_real(value):
            return value.to("meta")
        return torch.device("meta") if isinstance(value, torch.device) else value

    meta_args, meta_kwargs = tree_map(to_meta, (args, dict(kwargs or {})))
    if "device" in meta_kwargs:
        meta_kwargs["device"] = torch.device("meta")
    try:
        outputs = func(*meta_args, **meta_kwargs)
    except Exception:   # no meta kernel: the check after the op still applies
        return
    for tensor in tree_flatten(outputs)[0]:
        if isinstance(tensor, torch.Tensor) and tensor.device.type == "meta":
            nbytes = tensor.untyped_storage().nbytes()
            if nbytes > REAL_ALLOCATION_LIMIT_BYTES:
                raise RealAllocationError(
                    f"{func} would make a real {nbytes:,}-byte tensor while tracing (limit "
                    f"{REAL_ALLOCATION_LIMIT_BYTES:,}); refused before allocating: the model "
                    "creates tensors outside the fake mode")


class RealAllocationGuard(_PlainDispatchMode):
    """A forward run for real on meta tensors (torchinfo's layer table): an op that would
    make a real tensor over ``REAL_ALLOCATION_LIMIT_BYTES`` (a model leaving the meta world
    with ``torch.zeros(n)`` on the CPU) is refused before a byte is taken."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if _wrapper_subclass(types):
            return NotImplemented
        if func not in METADATA_OPS and _may_allocate_real(args, kwargs):
            _refuse_before_real_allocation(func, args, kwargs)
        return func(*args, **(kwargs or {}))


def _may_allocate_real(args, kwargs) -> bool:
    """An op can make a real tensor when a real tensor or a device reaches it, or no tensor
    does (a factory: ``zeros``, ``arange``…); ops on meta tensors alone cannot."""
    values = list(_op_values((*args, *(kwargs or {}).values())))
    tensors = [value for value in values if isinstance(value, torch.Tensor)]
    return (not tensors or any(_is_real(tensor) for tensor in tensors)
            or any(isinstance(value, torch.device) and value.type != "meta"
                   for value in values))


def _refuse_real_allocation(func, tensor: torch.Tensor) -> None:
    if isinstance(tensor, FakeTensor) or tensor.device.type == "meta":
        return
    nbytes = tensor.untyped_storage().nbytes()
    if nbytes > REAL_ALLOCATION_LIMIT_BYTES:
        raise RealAllocationError(
            f"{func} made a real {nbytes:,}-byte tensor while tracing (limit "
            f"{REAL_ALLOCATION_LIMIT_BYTES:,}); the model creates tensors outside the fake mode")


def materialize_fake(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """Replace a meta-device model's parameters and buffers by fake CPU tensors, in place.

    Call inside an active fake mode. Each distinct tensor gets one replacement, so shared
    (tied) weights stay shared: ``Module.to_empty`` would give GPT-2's embedding and LM head
    two tensors and double-count them. Floating tensors become ``dtype``.
    """
    replacements: dict[int, torch.Tensor] = {}

    def fake_twin(tensor: torch.Tensor, as_parameter: bool) -> torch.Tensor:
        if id(tensor) not in replacements:
            twin_dtype = dtype if tensor.is_floating_point() else tensor.dtype
            twin = torch.empty(tensor.shape, dtype=twin_dtype, device="cpu")
            if as_parameter:
                twin = nn.Parameter(twin, requires_grad=tensor.requires_grad)
            replacements[id(tensor)] = twin
        return replacements[id(tensor)]

    for module in model.modules():
        for name, param in module._parameters.items():
            if param is not None:
                module._parameters[name] = fake_twin(param, as_parameter=True)
        for name, buffer in module._buffers.items():
            if buffer is not None:
                module._buffers[name] = fake_twin(buffer, as_parameter=False)
    return model


def set_padding_mode_cache(module: torch.nn.Module, padding: tuple[int, ...]) -> None:
    """Keep a conv's private ``_reversed_padding_repeated_twice`` (what non-zero padding modes
    pad with, ``torch/nn/modules/conv.py``) in step with a changed ``padding``."""
    if hasattr(module, "_reversed_padding_repeated_twice"):
        module._reversed_padding_repeated_twice = [p for p in reversed(padding) for _ in range(2)]


class FlopCountingMode(_PlainDispatchMode):
    """FLOPs per ATen op from torch's own formulas (``torch.utils.flop_counter.flop_registry``),
    without ``FlopCounterMode``'s module tracker: its hooks on every module's outputs keep
    tensors alive that activation checkpointing would free, which changes the traced peak.

    Also ``launched_ops``: the ops that launch work (not views, not bare allocations), what
    the host's launch time per step grows with, and ``kernels``: each of them in order with
    its class, FLOPs and bytes touched (``memcalc.trace.kernels``), for the step-time model.
    ``flops_closed`` stops adding to ``by_op`` and ``launched_ops`` (the optimizer's step is
    timed, not counted as model FLOPs)."""

    def __init__(self) -> None:
        super().__init__()
        self.by_op: Counter = Counter()
        self.launched_ops = 0
        self.kernels: list[Kernel] = []
        self.flops_closed = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        device = fake_device(func, args)
        if device is not None:
            return device
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func._overloadpacket.__name__
        if (func in METADATA_OPS or getattr(func, "is_view", False)   # older torch: no is_view
                or name in _NO_KERNEL):
            return out
        formula = flop_registry.get(func._overloadpacket) or _CPU_ATTENTION_FLOPS.get(name)
        flops = int(formula(*args, **kwargs, out_val=out)) if formula is not None else 0
        if not self.flops_closed:
            self.launched_ops += 1
            if formula is not None:
                self.by_op[name] += flops
        elif name in _FIRST_STEP_ONLY:
            return out
        self.kernels.append(_kernel(name, args, kwargs, out, flops, not self.flops_closed))
        return out


def _cpu_attention_flops(query, key, value, *args, out_val=None, **kwargs) -> int:
    formula = getattr(torch.utils.flop_counter, "sdpa_flop_count", None)   # torch ≥ 2.2
    return formula(query.shape, key.shape, value.shape) if formula else 0


def _cpu_attention_backward_flops(grad_out, query, key, value, *args, out_val=None,
                                  **kwargs) -> int:
    formula = getattr(torch.utils.flop_counter, "sdpa_backward_flop_count", None)
    return formula(grad_out.shape, query.shape, key.shape, value.shape) if formula else 0


_CPU_ATTENTION_FLOPS = {
    "_scaled_dot_product_flash_attention_for_cpu": _cpu_attention_flops,
    "_scaled_dot_product_flash_attention_for_cpu_backward": _cpu_attention_backward_flops}
"""CPU's flash-attention kernel, which stands in the trace for CUDA's flash and cuDNN
attention: torch's flop formulas cover the CUDA ops only (``flop_registry`` counts none for
it), so its FLOPs are counted with theirs (``sdpa_flop_count``, its backward's)."""

_HALF = {torch.bfloat16: "bf16", torch.float16: "fp16"}

_FIRST_STEP_ONLY = frozenset({"zeros_like", "zeros", "full", "_record_function_enter_new",
                              "_record_function_exit"})
"""Ops of the optimizer's step that make its state (the first step only) or mark a profiler
range: not part of the step a job repeats."""


def _kernel(name: str, args, kwargs, out, flops: int, batched: bool) -> Kernel:
    tensors = [t for t in tree_flatten((args, kwargs, out))[0] if isinstance(t, torch.Tensor)]
    moved = sum(t.numel() * t.element_size() for t in tensors)
    half = next((_HALF[t.dtype] for t in tensors[:2] if t.dtype in _HALF), "")
    operand_dims = per_group = None
    if "convolution" in name and len(tensors) > 2:
        operand_dims = tensors[1].dim()
        per_group = tensors[2 if "backward" in name else 1].shape[1]   # the weight's
    return Kernel(kernel_class(name, operand_dims, per_group), half, flops, moved, batched)


_NO_KERNEL = frozenset({"empty", "empty_like", "empty_strided", "new_empty",
                        "new_empty_strided", "lift_fresh", "_local_scalar_dense"})
"""Ops that allocate or read a scalar without launching a kernel."""


_LAST_GROUP: list[tuple] = []
"""The key of the last fake process group this process made (none since the caches were
last emptied: ``_forget_dtensor_shardings``)."""


@contextlib.contextmanager
def fake_process_group(world_size: int, rank: int = 0, layout: tuple = ()) -> Iterator[None]:
    """This process as ``rank`` of a ``world_size``-rank job on torch's ``fake`` backend
    (every collective a no-op): the default process group for the duration, destroyed after.
    Refused when the process already has one (a real job's group is never replaced).
    ``layout``: what decides the subgroups the trace will make (the mesh's dimensions); a
    group of another layout or rank than the last one empties DTensor's caches first."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if not dist.is_available():
        raise RuntimeError("this torch build has no torch.distributed")
    if dist.is_initialized():
        raise RuntimeError("this process already has a default process group")
    key = (world_size, rank, layout)
    if _LAST_GROUP and _LAST_GROUP[0] != key:
        _forget_dtensor_shardings()
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    _LAST_GROUP[:] = [key]
    try:
        yield
    finally:
        dist.destroy_process_group()


def _forget_dtensor_shardings() -> None:
    """DTensor's sharding-propagation caches emptied (torch ≥ 2.5, ``torch.distributed.tensor
    .debug``). Their entries hold the device meshes of the traces that made them, and a later
    mesh of the same shape compares equal to those: the same layout and rank make their
    subgroups again under the same names, but another rank (the next stage of a pipeline,
    the last rank of a context-parallel group), another layout, or the caller's own job would
    be handed a mesh whose group no longer resolves, or resolves to another one. Kept between
    traces of one rank (a batch search: the caches save each trace about a fifth)."""
    _LAST_GROUP.clear()
    if "torch.distributed.tensor" not in sys.modules:
        return
    from torch.distributed.tensor import debug

    clear = getattr(debug, "_clear_sharding_prop_cache", None)
    if clear is not None:
        clear()


@contextlib.contextmanager
def dtensor_caches_left_clean() -> Iterator[None]:
    """Around a public call: DTensor's caches emptied on the way out where a fake process
    group was made in it (the caller's DTensors must never meet its meshes)."""
    try:
        yield
    finally:
        if _LAST_GROUP:
            _forget_dtensor_shardings()


def fsdp_offload_copy_sites() -> frozenset:
    """The code of FSDP2's two copies across host and GPU under ``CPUOffloadPolicy``: a
    unit's sharded parameters to the GPU for the all-gather (``FSDPParam.all_gather_inputs``)
    and a reduced gradient shard back to the host (``foreach_reduce``); empty where this
    torch has neither."""
    try:
        from torch.distributed.fsdp._fully_shard import _fsdp_collectives, _fsdp_param
    except ImportError:
        return frozenset()
    sites = (getattr(getattr(_fsdp_param.FSDPParam, "all_gather_inputs", None), "fget", None),
             getattr(_fsdp_collectives, "foreach_reduce", None))
    # foreach_reduce runs under @torch.no_grad(): its own code is the wrapped function's
    return frozenset(inspect.unwrap(site).__code__ for site in sites if site is not None)


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (FSDP2 / tensor-parallel parameters); other tensors as they are."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if callable(to_local) else tensor


def function_mode_stack() -> list:
    """The torch-function modes active on this thread, outermost first."""
    from torch.overrides import _get_current_function_mode_stack

    return list(_get_current_function_mode_stack())


@contextlib.contextmanager
def fake_mode_paused() -> Iterator[None]:
    """The fake mode off the stack (``unset_fake_temporarily``): fake tensors still compute
    as fakes, but a small real tensor (a device mesh's rank table) computes for real, as
    FSDP2 needs to join its mesh with tensor parallelism's."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():
        yield


def is_fake(tensor: torch.Tensor) -> bool:
    return isinstance(local_tensor(tensor), FakeTensor)


@contextlib.contextmanager
def callers_torch_modes_set_aside() -> Iterator[None]:
    """The estimate as a function of its spec alone: grad mode on, inference mode off,
    autocast off, float32 as the default dtype, and the caller's torch-function modes (``with
    torch.device(...)``, ``torch.set_default_device``) off this thread's stack; every one of
    them restored as it was on the way out. (``torch._C._pop_torch_function_stack`` and
    ``_push_on_torch_function_stack``, torch ≥ 2.1.)"""
    modes = []
    while torch._C._len_torch_function_stack() > 0:
        modes.append(torch._C._pop_torch_function_stack())
    autocast = {device: _autocast_enabled(device) for device in ("cpu", "cuda")}
    dtype = torch.get_default_dtype()
    try:
        if dtype is not torch.float32:      # process-wide: touched only when it differs
            torch.set_default_dtype(torch.float32)
        for device in autocast:
            _set_autocast(device, False)
        with torch.enable_grad(), torch.inference_mode(False):
            yield
    finally:
        for device, enabled in autocast.items():
            _set_autocast(device, enabled)
        if torch.get_default_dtype() is not dtype:
            torch.set_default_dtype(dtype)
        for mode in reversed(modes):
            torch._C._push_on_torch_function_stack(mode)


def _autocast_enabled(device: str) -> bool:
    try:
        return torch.is_autocast_enabled(device)
    except TypeError:                         # torch < 2.4: one function per device
        return (torch.is_autocast_cpu_enabled() if device == "cpu"
                else torch.is_autocast_enabled())


def _set_autocast(device: str, enabled: bool) -> None:
    try:
        torch.set_autocast_enabled(device, enabled)
    except TypeError:                         # torch < 2.4
        (torch.set_autocast_cpu_enabled if device == "cpu" else torch.set_autocast_enabled)(
            enabled)


def static_pipeline_warmup(schedule) -> None:
    """A pipeline schedule's first-step vote (each rank says whether its stages were given
    their input and output shapes, and all agree on the answer by a send/recv chain) decided
    as every rank of the traced job decides it: yes, as memcalc gives every stage its shapes.
    The vote reads the received answer with ``.item()``, which a fake process group cannot
    supply. Torch versions without the vote (``_warmup_p2p``) are left as they are."""
    if not hasattr(schedule, "_warmup_p2p"):
        return
    from torch.distributed.pipelining.stage import InferenceMode

    def warm_up(stages, has_backward, p2p_done) -> None:
        for stage in stages:
            stage._inference_mode = InferenceMode.STATIC

    schedule._warmup_p2p = warm_up


def schedule_stages(schedule) -> list:
    """The pipeline stages a schedule runs (its ``_stages``, or ``_stage`` for the
    single-stage schedules)."""
    return list(getattr(schedule, "_stages", None) or [schedule._stage])


class _HeldSend:
    """A point-to-point work that keeps the tensors its batch sent for as long as the work
    itself lives, as gloo's and NCCL's works do (they hold the tensors they were given until
    they are destroyed; the schedules keep the last works in a variable after waiting for
    them); the fake backend's own work lets them go at once."""

    def __init__(self, work, sent: list) -> None:
        self._work, self._sent = work, sent

    def __getattr__(self, name: str):
        return getattr(self._work, name)


@contextlib.contextmanager
def pipeline_sends_held() -> Iterator[None]:
    """While tracing a pipeline rank: the schedules' batched sends and receives
    (``schedules._batch_p2p``) hand back works that keep what they sent until waited for."""
    import torch.distributed as dist
    from torch.distributed.pipelining import schedules

    original = schedules._batch_p2p

    def batch_p2p(p2p_ops, desc=None):
        sent = [op.tensor for op in p2p_ops if op.op is dist.isend]
        return [_HeldSend(work, sent) for work in original(p2p_ops, desc)]

    schedules._batch_p2p = batch_p2p
    try:
        yield
    finally:
        schedules._batch_p2p = original


@contextlib.contextmanager
def dataloader_signals_kept() -> Iterator[None]:
    """torch's DataLoader installs a SIGCHLD handler the first time a process iterates one
    with workers, and marks that it did (so it never installs it again): both undone after
    the block, so the caller's process is as a fresh one (its own first loader installs
    torch's handler as usual). Signal handlers belong to the main thread: elsewhere nothing
    can have been installed, and nothing is done."""
    import signal
    import threading

    from torch.utils.data._utils import signal_handling

    main = threading.current_thread() is threading.main_thread()
    handler = signal.getsignal(signal.SIGCHLD) if main else None
    installed = signal_handling._SIGCHLD_handler_set
    try:
        yield
    finally:
        if main:
            signal.signal(signal.SIGCHLD, handler)
            signal_handling._SIGCHLD_handler_set = installed


def _optimized_module_type() -> type | None:
    """``torch._dynamo.eval_frame.OptimizedModule``, the wrapper ``torch.compile(module)``
    returns; None while dynamo was never imported (then no module can be compiled)."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    return getattr(eval_frame, "OptimizedModule", None)


def compiled_module_names(model: nn.Module) -> list[str]:
    """Modules of ``model`` that run compiled: wrapped by ``torch.compile`` (its ``_orig_mod``
    is the module) or compiled in place by ``Module.compile()`` (``_compiled_call_impl``,
    torch ≥ 2.2); ``""`` is the model itself."""
    wrapper = _optimized_module_type()
    names = []
    for name, module in model.named_modules():
        if (wrapper is not None and isinstance(module, wrapper)) or getattr(
                module, "_compiled_call_impl", None) is not None:
            names.append(name.replace("_orig_mod.", "").removesuffix("._orig_mod")
                         .removeprefix("_orig_mod"))
    return names


def without_compile(model: nn.Module) -> nn.Module:
    """``model`` with every ``torch.compile`` wrapper replaced by its module and in-place
    compilation undone (the caller passes its own copy: this changes it)."""
    wrapper = _optimized_module_type()
    while wrapper is not None and isinstance(model, wrapper):
        model = model._orig_mod
    for module in list(model.modules()):
        for name, child in list(module._modules.items()):
            while wrapper is not None and isinstance(child, wrapper):
                child = child._orig_mod
            module._modules[name] = child
        if getattr(module, "_compiled_call_impl", None) is not None:
            module._compiled_call_impl = None
    return model


@contextlib.contextmanager
def dispatch_modes_paused() -> Iterator[None]:
    """No dispatch mode active inside (``torch.utils._python_dispatch._disable_current_modes``):
    the fake tensors keep their own mode, the watcher sees nothing (a graph capture's
    tensors are not the step's)."""
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        yield


def aot_joint_capture(module: nn.Module, flat_args: list, run_graph: Callable):
    """AOTAutograd's capture of ``module(*flat_args)`` (tuple outputs) as ``torch.compile``'s
    inductor backend makes it for training: the joint forward/backward graph, split by
    ``min_cut_rematerialization_partition`` (what the forward saves for backward and what
    the backward recomputes), after Inductor's decompositions (``select_decomp_table``:
    what the partitioner may recompute depends on them). ``run_graph(graph_module)``
    returns the callable each graph runs as (boxed: it takes one list of inputs). Needs
    torch ≥ 2.1
    (``torch._functorch.aot_autograd.aot_module_simplified``)."""
    import importlib

    from torch._functorch.aot_autograd import aot_module_simplified
    from torch._functorch.partitioners import min_cut_rematerialization_partition
    from torch._inductor.decomposition import select_decomp_table

    # some decompositions read Inductor's lowerings (torch 2.14: 3D U-Nets' pooling), which
    # Inductor has imported by the time it decomposes
    with contextlib.suppress(ImportError):
        importlib.import_module("torch._inductor.lowering")

    def compiler(graph_module, _example_inputs):
        run = run_graph(graph_module)
        run._boxed_call = True
        return run
    return aot_module_simplified(module, flat_args, compiler, compiler,
                                 partition_fn=min_cut_rematerialization_partition,
                                 decompositions=select_decomp_table())


def inductor_layout_optimization(graph_module, *, cuda: bool) -> bool:
    """Whether Inductor lays this training graph's convolutions out channels-last
    (``GraphLowering.decide_layout_opt``): on a CPU with oneDNN always; for a CUDA GPU by
    its heuristics, read with oneDNN set aside (the trace's fakes are CPU tensors). False
    where this torch has no such decision."""
    try:
        from torch._inductor.graph import GraphLowering
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with torch.backends.mkldnn.flags(enabled=not cuda and torch.backends.mkldnn.enabled):
                return bool(GraphLowering.decide_layout_opt(graph_module, is_inference=False))
    except Exception:   # private API: absent or changed in this torch build
        return False


def is_convolution_op(target) -> bool:
    """``aten.convolution`` (the op Inductor's layout optimisation turns channels-last)."""
    return target is torch.ops.aten.convolution.default


def is_pointwise_op(target) -> bool:
    """An ATen overload tagged pointwise (``torch._ops.OpOverload.tags``)."""
    return isinstance(target, torch._ops.OpOverload) and torch.Tag.pointwise in target.tags


def out_variant(target) -> tuple[Callable, str] | None:
    """The ``out=`` overload of an ATen op with the same other arguments (``gelu_backward``
    → ``gelu_backward.grad_input``) and the name of its one out argument; None where none."""
    if not isinstance(target, torch._ops.OpOverload):
        return None
    signature = [(argument.name, str(argument.type)) for argument in target._schema.arguments]
    packet = target.overloadpacket
    for overload in packet.overloads():
        candidate = getattr(packet, overload)
        arguments = candidate._schema.arguments
        outs = [argument.name for argument in arguments if argument.is_out]
        # the same arguments of the same types (pow.Tensor_Scalar is not pow.Tensor_Tensor_out)
        if len(outs) == 1 and [(a.name, str(a.type)) for a in arguments
                               if not a.is_out] == signature:
            return candidate, outs[0]
    return None


def is_view_op(target) -> bool:
    """An ATen overload whose output is a view of its input (``OpOverload.is_view``)."""
    return isinstance(target, torch._ops.OpOverload) and target.is_view


def is_reduction_op(target) -> bool:
    """An ATen overload tagged as a reduction (``sum``, ``var_mean``, ``amax``…)."""
    return isinstance(target, torch._ops.OpOverload) and torch.Tag.reduction in target.tags


def fake_stand_in(tensor: torch.Tensor) -> torch.Tensor:
    """A new fake tensor of ``tensor``'s mode, size, strides, dtype and grad requirement
    (``FakeTensor.fake_mode``): an example for a capture that may keep its examples."""
    with tensor.fake_mode:
        made = torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype,
                                   device=tensor.device)
    return made.requires_grad_(tensor.requires_grad)
