"""numpy buffers refused above a size while a step is traced.

A forward that leaves the fake world with numpy (``np.ones`` of the batch's size, a
``.numpy()`` copy filled in a loop) takes real memory that the trace does not count, and can
take the machine's: the torch side is refused in ``_torch_internals``, the numpy side here,
before a byte is taken. numpy ≥ 1.22 allocates array data through a handler held in a
context variable (``PyDataMem_SetHandler``, NEP 49), so the limit holds in the tracing
thread's context only: the caller's other threads, and the caller's arrays made before and
after, keep numpy's own handler. An array made under the limit keeps the handler that freed
it, so the handler lives as long as the process.

Known limitations: numpy's C API table is reached through ctypes (slots 304 and 306 of
``__multiarray_api.h``, stable since numpy 1.22); without numpy, or an older one, nothing is
limited here. An array growing in place (``realloc``: ``ndarray.resize``, ``np.fromiter``) is
not limited, nor memory that C extensions take with their own ``malloc``.
"""

from __future__ import annotations

import ctypes
import threading
from contextlib import contextmanager
from typing import Iterator

from memcalc.trace._torch_internals import REAL_ALLOCATION_LIMIT_BYTES

_SET_HANDLER_SLOT, _DEFAULT_HANDLER_SLOT = 304, 306
"""``PyDataMem_SetHandler`` and ``PyDataMem_DefaultHandler`` in numpy's ``PyArray_API`` table
(numpy/_core/include/numpy/__multiarray_api.h, ``NPY_1_22_API_VERSION``)."""
_CAPSULE_NAME = b"mem_handler"
"""The capsule name numpy checks on a handler (``MEM_HANDLER_CAPSULE_NAME``)."""

_MALLOC = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
_CALLOC = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t)


class _Allocator(ctypes.Structure):
    """``PyDataMemAllocator``: a context and four function pointers."""

    _fields_ = [("ctx", ctypes.c_void_p), ("malloc", ctypes.c_void_p),
                ("calloc", ctypes.c_void_p), ("realloc", ctypes.c_void_p),
                ("free", ctypes.c_void_p)]


class _Handler(ctypes.Structure):
    """numpy's ``PyDataMem_Handler`` (version 1)."""

    _fields_ = [("name", ctypes.c_char * 127), ("version", ctypes.c_uint8),
                ("allocator", _Allocator)]


class NumpyBufferRefused(MemoryError):
    """A numpy buffer over the limit was asked for while tracing."""


_local = threading.local()
"""Per thread: ``limit`` (bytes) while a trace runs, ``refused`` the sizes refused."""


def _allowed(nbytes: int) -> bool:
    limit = getattr(_local, "limit", None)
    if limit is None or nbytes <= limit:
        return True
    _local.refused.append(nbytes)
    return False


class _LimitedHandler:
    """The handler's struct, its callbacks and its capsule, made once per process. Its
    ``malloc`` and ``calloc`` check the size, then call numpy's default ones (holding the
    GIL, as numpy's block cache needs); ``realloc`` and ``free`` are numpy's default ones
    themselves, so no Python runs when an array made under the limit is freed later (at
    interpreter exit too)."""

    def __init__(self, numpy_api: ctypes.Array):
        default_capsule = ctypes.py_object.from_address(numpy_api[_DEFAULT_HANDLER_SLOT]).value
        default = _Handler.from_address(_capsule_pointer(default_capsule, _CAPSULE_NAME))
        plain = default.allocator
        malloc = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)(plain.malloc)
        calloc = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                   ctypes.c_size_t)(plain.calloc)
        self.callbacks = (
            _MALLOC(lambda ctx, size: malloc(ctx, size) if _allowed(size) else None),
            _CALLOC(lambda ctx, count, size: calloc(ctx, count, size)
                    if _allowed(count * size) else None))
        self.struct = _Handler(b"memcalc_trace_limit", 1, _Allocator(
            plain.ctx, *(ctypes.cast(callback, ctypes.c_void_p).value
                         for callback in self.callbacks), plain.realloc, plain.free))
        new_capsule = ctypes.pythonapi.PyCapsule_New
        new_capsule.restype = ctypes.py_object
        new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        self.capsule = new_capsule(ctypes.addressof(self.struct), _CAPSULE_NAME, None)
        # PYFUNCTYPE: numpy's C API is called holding the GIL
        self.set_handler = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.py_object)(
            numpy_api[_SET_HANDLER_SLOT])


def _capsule_pointer(capsule, name: bytes | None) -> int:
    get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    get_pointer.restype = ctypes.c_void_p
    get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    return get_pointer(capsule, name)


_handler: _LimitedHandler | None = None
_made = threading.Lock()


def _limited_handler() -> _LimitedHandler | None:
    """None where numpy is missing or older than 1.22."""
    global _handler
    with _made:
        if _handler is None:
            api = _numpy_api()
            if api is None:
                return None
            _handler = _LimitedHandler(api)
        return _handler


def _numpy_api() -> ctypes.Array | None:
    try:
        import numpy
    except ImportError:
        return None
    if tuple(int(part) for part in numpy.__version__.split(".")[:2]) < (1, 22):
        return None
    try:
        from numpy._core import _multiarray_umath as multiarray   # numpy 2
    except ImportError:
        from numpy.core import _multiarray_umath as multiarray    # numpy 1.22-1.26
    return (ctypes.c_void_p * (_DEFAULT_HANDLER_SLOT + 1)).from_address(
        _capsule_pointer(multiarray._ARRAY_API, None))


@contextmanager
def numpy_buffer_limit(limit_bytes: int = REAL_ALLOCATION_LIMIT_BYTES) -> Iterator[list[int]]:
    """Within it, in this thread's context, numpy refuses a buffer over ``limit_bytes`` (it
    raises MemoryError); yields the list of refused sizes. numpy's previous handler is set
    back on every exit."""
    handler = _limited_handler()
    refused: list[int] = []
    if handler is None:
        yield refused
        return
    outer = getattr(_local, "limit", None), getattr(_local, "refused", None)
    _local.limit, _local.refused = limit_bytes, refused
    previous = handler.set_handler(handler.capsule)
    try:
        yield refused
    finally:
        handler.set_handler(previous)
        _local.limit, _local.refused = outer
