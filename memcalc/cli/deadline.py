"""A command's time limit (``--timeout``), held even when the user's code never returns.

Two layers, because the user's code may hang in Python or in C:
- at the deadline, SIGALRM raises ``DeadlineExceeded`` in the main thread; it unwinds the stack
  like any exception, so every ``finally`` runs and child process groups are killed;
- a watchdog thread waits ``HARD_GRACE_S`` longer: a C call that never returns to the
  interpreter (where no signal handler can run) is ended there, with the same one-line error,
  after the processes the command started are killed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator

import click

from memcalc.cli.leftovers import leftovers_warning
from memcalc.cli.signal_raise import put_back, raise_where_safe
from memcalc.cli.types import FiniteFloatRange

DEFAULT_TIMEOUT_S = 900.0
HARD_GRACE_S = 10.0
_CONTEXT_KEY = "timeout_s"


class DeadlineExceeded(BaseException):
    """``--timeout`` ran out. A BaseException, so no ``except Exception`` in the user's code or
    in memcalc swallows it."""

    def __init__(self, seconds: float) -> None:
        super().__init__(seconds)
        self.seconds = seconds


def timeout_message(seconds: float) -> str:
    return (f"did not finish within --timeout {seconds:g} s: the model's code or the Dataset "
            "hangs, or the work needs longer (raise --timeout; 0 for no limit)")


def timeout_option(command: Callable) -> Callable:
    """``--timeout SECONDS`` on a command; the value is kept on the click context."""
    def remember(ctx: click.Context, _param, value: float) -> float:
        ctx.meta[_CONTEXT_KEY] = value
        return value

    return click.option(
        "--timeout", type=FiniteFloatRange(min=0, max=7 * 86400), default=DEFAULT_TIMEOUT_S,
        show_default=True, expose_value=False, callback=remember,
        help="Seconds the whole command may take, the user's code included (0: no limit).",
    )(command)


def timeout_of(ctx: click.Context) -> float:
    return float(ctx.meta.get(_CONTEXT_KEY, 0.0) or 0.0)


@contextlib.contextmanager
def deadline(seconds: float, on_hard_stop: Callable[[str], None]) -> Iterator[None]:
    """Raise ``DeadlineExceeded`` after ``seconds`` (0: no limit); if the main thread is stuck
    in C code ``HARD_GRACE_S`` after that, call ``on_hard_stop(message)`` from a watchdog thread
    (it must end the process)."""
    if seconds <= 0 or threading.current_thread() is not threading.main_thread():
        yield
        return

    def alarm(signum, frame) -> None:
        raise_where_safe(signum, frame, DeadlineExceeded(seconds))

    finished = threading.Event()

    def watchdog() -> None:
        if not finished.wait(seconds + HARD_GRACE_S):
            on_hard_stop(timeout_message(seconds))

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    guard = threading.Thread(target=watchdog, name="memcalc-deadline", daemon=True)
    guard.start()
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        put_back(signal.SIGALRM, previous)
        finished.set()


def hard_exit(message: str, code: int, ended: int = 0) -> None:
    """The last resort of the watchdog: one line on stderr (after the warning about the
    ``ended`` processes the user's code left) and the exit code, from any thread."""
    warning = f"{leftovers_warning(ended)}\n" if ended else ""
    with contextlib.suppress(OSError):
        os.write(2, f"\n{warning}Error: {message}\n".encode())
    _REAL_EXIT(code)


_REAL_EXIT = os._exit
"""Saved at import: during a command ``os._exit`` is trapped (``memcalc.cli.traps``)."""
