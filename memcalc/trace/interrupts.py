"""Ctrl-C during a trace, delivered where it is safe.

A trace runs Python inside torch's C++: dispatch modes, and weakref callbacks that fire when
a fake storage dies, some of them inside C++ destructors. A ``KeyboardInterrupt`` raised
there cannot unwind through C++ and aborts the interpreter ("terminate called after throwing
an instance of 'python_error'"). While a trace runs, SIGINT is therefore only noted; it is
acted on at the next safe point (a module's forward starting, the step entering a phase),
where the handler that was there before runs, or at the end of the trace. Only the main
thread can handle signals: elsewhere, and where SIGINT is ignored or left to the system,
nothing is installed.
"""

from __future__ import annotations

import signal
import threading


class DeferredInterrupts:
    """A context: SIGINT noted inside it, delivered by ``check`` or on leaving."""

    def __init__(self) -> None:
        self.pending = False
        self._before = None

    def __enter__(self) -> DeferredInterrupts:
        if threading.current_thread() is threading.main_thread():
            before = signal.getsignal(signal.SIGINT)
            if callable(before):
                self._before = before
                signal.signal(signal.SIGINT, self._note)
        return self

    def _note(self, signum, frame) -> None:
        self.pending = True

    def check(self) -> None:
        """At a safe point: run the caller's handler for a SIGINT that came meanwhile (the
        default one raises KeyboardInterrupt here). Further ones are still only noted while
        the trace unwinds."""
        if self.pending and self._before is not None:
            self.pending = False
            self._before(signal.SIGINT, None)

    def __exit__(self, *exc_info) -> None:
        if self._before is None:
            return
        signal.signal(signal.SIGINT, self._before)
        before, self._before = self._before, None
        if self.pending and exc_info[0] is None:
            self.pending = False
            before(signal.SIGINT, None)
