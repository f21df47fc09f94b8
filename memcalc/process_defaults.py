"""What a library call leaves of the caller's process defaults: the multiprocessing start
method, ``sys.path`` and the random streams (Python's, numpy's, torch's), kept as they were.

Starting a process from an explicit context (``get_context("spawn")``) still fixes the
*default* start method as a side effect: the child's preparation data asks
``multiprocessing.get_start_method()``, which sets it when nothing had. A training script's
own ``set_start_method("spawn")`` afterwards then raised "context has already been set".
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import random
import sys
import warnings
from collections.abc import Iterator


@contextlib.contextmanager
def default_start_method_kept() -> Iterator[None]:
    """Undo, on every exit path, a default start method fixed while the block ran."""
    before = multiprocessing.get_start_method(allow_none=True)
    try:
        yield
    finally:
        if before is None and multiprocessing.get_start_method(allow_none=True) is not None:
            multiprocessing.set_start_method(None, force=True)


@contextlib.contextmanager
def sys_path_kept() -> Iterator[None]:
    """``sys.path`` as it was after the call: importing a ``package.module:callable`` puts the
    current directory first, as ``python -m`` would, for the call only."""
    before = list(sys.path)
    try:
        yield
    finally:
        if sys.path != before:
            sys.path[:] = before


@contextlib.contextmanager
def random_states_kept() -> Iterator[None]:
    """Python's, numpy's and torch's CPU random states as they were after the block: what it
    draws (a DataLoader's base seed, a library that seeds an id counter when imported —
    rich's styles do) does not move the caller's seeded streams. numpy and torch are only
    looked at when already imported."""
    python = random.getstate()
    numpy = sys.modules.get("numpy")
    torch = sys.modules.get("torch")
    numpy_state = numpy.random.get_state() if numpy is not None else None
    torch_state = torch.get_rng_state() if torch is not None else None
    try:
        yield
    finally:
        random.setstate(python)
        if numpy_state is not None:
            numpy.random.set_state(numpy_state)
        if torch_state is not None:
            torch.set_rng_state(torch_state)


@contextlib.contextmanager
def environment_and_warnings_kept() -> Iterator[None]:
    """Environment variables and warnings filters that the block set (torch's lazily imported
    modules do: the inductor's ``TORCHINDUCTOR_CACHE_DIR``, sympy's filter) taken back; what
    the block changed of the caller's own is put back as it was."""
    environment, filters = dict(os.environ), list(warnings.filters)
    try:
        yield
    finally:
        for name in set(os.environ) - set(environment):
            del os.environ[name]
        for name, value in environment.items():
            if os.environ.get(name) != value:
                os.environ[name] = value
        added = [entry for entry in warnings.filters if entry not in filters]
        for entry in added:
            warnings.filters.remove(entry)
        mutated = getattr(warnings, "_filters_mutated", None)   # its caches, where it has one
        if added and mutated is not None:
            mutated()


@contextlib.contextmanager
def caller_process_kept() -> Iterator[None]:
    """Every default above kept around a public call."""
    with (sys_path_kept(), default_start_method_kept(), random_states_kept(),
          environment_and_warnings_kept()):
        yield


@contextlib.contextmanager
def resource_tracker_kept() -> Iterator[None]:
    """Starting a spawned child starts multiprocessing's resource tracker (a process, and a
    pipe to it held by the caller) when none runs: stopped again after the block, which
    must end after the children it started are gone (the tracker ends when every holder of
    its pipe has closed it). A tracker that still has semaphores to unregister (a process
    pool's queues, while a thread of theirs still holds them) is left running: stopped, a new
    one would start when they are finalised, and know none of them (a traceback at exit)."""
    from multiprocessing import resource_tracker

    tracker = resource_tracker._resource_tracker
    running = tracker._fd is not None
    try:
        yield
    finally:
        if not running and tracker._fd is not None and not _semaphores_alive():
            tracker._stop()


def _semaphores_alive() -> bool:
    """Whether a multiprocessing semaphore or lock still lives once garbage is collected."""
    import gc
    from multiprocessing.synchronize import SemLock

    gc.collect()
    return any(issubclass(type(item), SemLock) for item in gc.get_objects())
