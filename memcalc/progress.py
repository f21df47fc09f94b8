"""Progress of long work (traces, searches, plans), told to whoever listens: the command
line's spinner on stderr. A library call has no listener, and nothing is printed or kept.

The listener lives in a context variable of memcalc's own, so a caller's threads and
contexts are untouched and concurrent calls each keep theirs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

Listener = Callable[[str], None]

_LISTENER: ContextVar[Listener | None] = ContextVar("memcalc_progress", default=None)


def announce(text: str) -> None:
    """Tell the listener what is being done now (nothing without one)."""
    listener = _LISTENER.get()
    if listener is not None:
        listener(text)


@contextmanager
def listening(listener: Listener) -> Iterator[None]:
    """``listener`` hears every ``announce`` made in this context until it exits."""
    token = _LISTENER.set(listener)
    try:
        yield
    finally:
        _LISTENER.reset(token)
