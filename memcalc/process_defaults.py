"""What a library call leaves of the caller's process defaults: the multiprocessing start
method and ``sys.path``, kept as they were.

Starting a process from an explicit context (``get_context("spawn")``) still fixes the
*default* start method as a side effect: the child's preparation data asks
``multiprocessing.get_start_method()``, which sets it when nothing had. A training script's
own ``set_start_method("spawn")`` afterwards then raised "context has already been set".
"""

from __future__ import annotations

import contextlib
import multiprocessing
import sys
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
