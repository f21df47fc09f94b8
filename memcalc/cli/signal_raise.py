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

An exception raised elsewhere can still be lost without a word: C code that clears any error
of the Python it calls (a ``__hash__`` or ``__eq__`` under ``PyDict_GetItem``, a property
under ``PyObject_HasAttr``), or the user's ``except BaseException: pass``. A SIGTERM was once
seen to end a plan with exit 0 and nothing on stderr. So the raised exception is *owed* until
the command's guard catches it (``settle``): the signal comes again every ``RECHECK_S``; it is
let be while that exception is still being handled (a ``finally`` or ``__exit__`` cleaning
up), raised anew where it was lost, and raised by ``raise_owed`` when the work ends at the
latest.

Known limitations: a step that never leaves torch's code is not interrupted by SIGINT or
SIGTERM (``--timeout``'s watchdog still ends it).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from types import FrameType

RETRY_S = 0.02
RECHECK_S = 0.5
"""How often a signal whose exception is owed comes again, to see whether it was lost."""
_SWALLOWING_FILES = {"weakref.py", "_weakrefset.py"}
"""Weak-reference callbacks and finalizers (like ``__del__``): an exception raised in them is
printed and dropped, so the signal would be lost."""
_OWED: dict[int, BaseException] = {}
"""Signal number: its exception, raised and not yet caught by the command's guard."""
_RECHECKS: set[int] = set()
"""Signals sent again to look at an owed exception: after ``settle`` they mean nothing."""
_LOCK = threading.Lock()
"""Held to send a signal again and to settle: none is sent once the guard has the error."""
_TRACE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "trace")


def raise_where_safe(signum: int, frame: FrameType | None, error: BaseException) -> None:
    """Raise ``error`` for signal ``signum`` now, or send the signal again shortly when the
    interrupted ``frame`` runs inside torch's dispatch; nothing while the exception raised
    for it before is still being handled."""
    recheck = signum in _RECHECKS
    _RECHECKS.discard(signum)
    owed = _OWED.get(signum)
    if recheck and owed is None:
        return                  # sent again just before the guard caught the exception
    if owed is not None and _being_handled(owed):
        _send_later(signum, RECHECK_S, owed_only=True)
        return
    if _inside_dispatch(frame):
        _send_later(signum, RETRY_S, owed_only=owed is not None)
        return
    _OWED[signum] = error
    _send_later(signum, RECHECK_S, owed_only=True)
    raise error


def settle(signum: int | None = None) -> None:
    """The command's guard caught the exception (whichever signal's it was): nothing is owed,
    and no signal comes again. With ``signum``: that signal only (``put_back``)."""
    with _LOCK:
        if signum is None:
            _OWED.clear()
        else:
            _OWED.pop(signum, None)


def put_back(signum: int, handler) -> None:
    """Put ``handler`` back for ``signum`` once nothing is owed for it: a signal sent again
    after that would meet the handler that was there before."""
    settle(signum)
    signal.signal(signum, handler)


def raise_owed() -> None:
    """Raise a signal's exception that was raised during the work and lost there."""
    for error in list(_OWED.values()):
        raise error


def _send_later(signum: int, seconds: float, owed_only: bool) -> None:
    def send() -> None:
        with _LOCK:
            if owed_only and signum not in _OWED:
                return
            if owed_only:
                _RECHECKS.add(signum)
            os.kill(os.getpid(), signum)

    timer = threading.Timer(seconds, send)
    timer.daemon, timer.name = True, "memcalc-signal-retry"
    timer.start()


def _being_handled(error: BaseException) -> bool:
    """``error`` is what an ``except``, ``finally`` or ``__exit__`` running now handles (or an
    exception raised while handling it)."""
    current, seen = sys.exc_info()[1], set()
    while current is not None and id(current) not in seen:
        if current is error:
            return True
        seen.add(id(current))
        current = current.__context__
    return False


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
