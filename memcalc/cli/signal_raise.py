"""Exceptions for signals (SIGINT, SIGTERM, SIGALRM), raised where they can unwind.

A signal's Python handler runs in whatever Python frame the main thread is in. During a trace
that is often code torch calls from C++ (a dispatch mode, a fake tensor's metadata), and an
exception raised there can unwind into C++ that does not pass it on: the process aborts
(``terminate called after throwing an instance of 'python_error'``, SIGABRT), seen about once
in six SIGTERMs sent during a plan. So when the interrupted frame is torch's or a trace
mode's, the exception is not raised there: the signal is sent again ``RETRY_S`` later, until
it lands in other code (the model's forward, the step, memcalc's own), where it unwinds as any
exception does. Likewise in a weak-reference callback or a ``__del__``, where Python prints
the exception and drops it (the command then ran on to exit 0 with a traceback on stderr).

Known limitations: a step that never leaves torch's code is not interrupted by SIGINT or
SIGTERM (``--timeout``'s watchdog still ends it).
"""

from __future__ import annotations

import os
import sys
import threading
from types import FrameType

RETRY_S = 0.02
_SWALLOWING_FILES = {"weakref.py", "_weakrefset.py"}
"""Weak-reference callbacks and finalizers (like ``__del__``): an exception raised in them is
printed and dropped, so the signal would be lost."""
_TRACE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "trace")


def raise_where_safe(signum: int, frame: FrameType | None, error: BaseException) -> None:
    """Raise ``error`` for signal ``signum`` now, or send the signal again shortly when the
    interrupted ``frame`` runs inside torch's dispatch."""
    if _inside_dispatch(frame):
        retry = threading.Timer(RETRY_S, os.kill, (os.getpid(), signum))
        retry.daemon, retry.name = True, "memcalc-signal-retry"
        retry.start()
        return
    raise error


def _inside_dispatch(frame: FrameType | None) -> bool:
    if frame is None:
        return False
    if frame.f_code.co_name == "__del__" or os.path.basename(
            frame.f_code.co_filename) in _SWALLOWING_FILES:
        return True
    filename = os.path.abspath(frame.f_code.co_filename)
    torch = sys.modules.get("torch")
    roots = [_TRACE_DIR]
    if torch is not None and getattr(torch, "__file__", None):
        roots.append(os.path.dirname(os.path.abspath(torch.__file__)))
    return any(filename.startswith(root + os.sep) for root in roots)
