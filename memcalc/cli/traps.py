"""What the user's code may do to the memcalc process itself, caught while a command runs.

- ``os._exit(code)`` ends an interpreter without an exception: in the memcalc process it is
  turned into ``HardExit`` (forked children, whose ``os._exit`` is how they end, keep theirs);
- ``os.fork()`` without an exit in the child would make a second memcalc carry on: the child
  is marked, writes nothing and ends at its first output or at the command's end, and dies
  quietly when memcalc ends it;
- ``raise KeyboardInterrupt`` in the user's code is not Ctrl-C: a real SIGINT is recorded;
- a line the user's code leaves without its newline (a prompt, a progress message) would be
  glued to memcalc's ``Error:`` line: writes through ``sys.stderr`` are followed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from typing import TextIO

from memcalc.cli.signal_raise import put_back, raise_where_safe


class HardExit(BaseException):
    """The user's code called ``os._exit``."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


_STATE = {"owner": None, "forked_copy": False, "sigint": False, "line_open": False}


def forked_copy() -> bool:
    """This process is a copy the user's code forked from memcalc and did not end."""
    return bool(_STATE["forked_copy"]) and os.getpid() != _STATE["owner"]


def sigint_received() -> bool:
    return bool(_STATE["sigint"])


def end_forked_copy() -> None:
    """Called where a forked copy would write or finish: it ends, silently."""
    if forked_copy():
        os._exit(0)


def _in_forked_child() -> None:
    if _STATE["owner"] is not None:
        _STATE["forked_copy"] = True
        with contextlib.suppress(ValueError, OSError):
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


os.register_at_fork(after_in_child=_in_forked_child)


class _LineTracking:
    """A text stream that remembers whether its last write ended a line."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.at_line_start = True

    def write(self, text: str) -> int:
        if text:
            self.at_line_start = text.endswith("\n")
        return self._stream.write(text)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def stderr_at_line_start() -> bool:
    """False when the last write through ``sys.stderr`` during a command left a line open."""
    stream = sys.stderr
    if isinstance(stream, _LineTracking):
        return stream.at_line_start
    return not _STATE["line_open"]


@contextlib.contextmanager
def trapped() -> Iterator[None]:
    """Install the traps for a command; after it, ``stderr_at_line_start`` still says whether
    the user's code left a line open."""
    owner, real_exit = os.getpid(), os._exit
    _STATE.update(owner=owner, forked_copy=False, sigint=False, line_open=False)

    def exit_trap(code: int) -> None:
        if os.getpid() != owner:
            real_exit(code)
        raise HardExit(code)

    def on_sigint(signum, frame) -> None:
        _STATE["sigint"] = True
        raise_where_safe(signum, frame, KeyboardInterrupt())

    previous_sigint = signal.getsignal(signal.SIGINT)
    replaced = previous_sigint not in (signal.SIG_IGN, None)   # not ignored (a background job)
    if replaced:
        signal.signal(signal.SIGINT, on_sigint)
    real_stderr, tracking = sys.stderr, _LineTracking(sys.stderr)
    sys.stderr, os._exit = tracking, exit_trap
    try:
        yield
    finally:
        sys.stderr, os._exit = real_stderr, real_exit
        _STATE.update(owner=None, line_open=not tracking.at_line_start)
        if replaced:
            put_back(signal.SIGINT, previous_sigint)
