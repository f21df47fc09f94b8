"""The ``memcalc`` command's entry point: click's group, then an exit that does not wait for
threads the user's code started and left running (a non-daemon thread would otherwise keep
the finished command alive for ever)."""

from __future__ import annotations

import atexit
import contextlib
import gc
import multiprocessing.util
import os
import signal
import sys
import threading
import time

import click

from memcalc import early_workers
from memcalc.cli.guard import INTERRUPTED_EXIT_CODE, TERMINATED_EXIT_CODE

STRAY_GRACE_S = 2.0
"""How long threads still running at the end get to finish (a process pool's manager thread
ends once its pool is collected) before they are called left running."""


_STOPPED = {signal.SIGTERM: (b"terminated (SIGTERM)", TERMINATED_EXIT_CODE),
            signal.SIGINT: (b"interrupted", INTERRUPTED_EXIT_CODE)}


def run() -> None:
    for number in _STOPPED:                 # not where ignored (a background job)
        if signal.getsignal(number) in (signal.SIG_DFL, signal.default_int_handler):
            signal.signal(number, _stopped_outside_the_command)
    held = signal.pthread_sigmask(signal.SIG_BLOCK, set(_STOPPED))
    try:        # a signal meanwhile is acted on once the workers are there to end
        # a plan's workers start importing torch now, beside this process doing the same
        early_workers.prestart(sys.argv[1:])
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
    try:
        from memcalc.cli.commands import main
        main()
        code: object = 0
    except SystemExit as done:
        code = done.code
    finally:
        early_workers.discard()
    if code == INTERRUPTED_EXIT_CODE:
        # Interrupted and answered (its workers ended, its Error: line written): exit now,
        # without the interpreter's shutdown. Through it, a plan with worker processes was
        # still ended by SIGINT itself (status -2, not 130) in about one run in three, and
        # in one in ten with SIGINT ignored first; exiting here, in none of 44.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        _unlink_semaphores()
        _exit_now(INTERRUPTED_EXIT_CODE)
    stray = _running_threads()
    if stray:
        gc.collect()            # an unreferenced executor wakes its manager thread to end
        deadline = time.monotonic() + STRAY_GRACE_S
        for thread in stray:
            thread.join(max(0.0, deadline - time.monotonic()))
        stray = _running_threads()
    if not stray:
        _finish(code)
    names = ", ".join(repr(thread.name) for thread in stray)
    click.echo(f"Warning: stopped {len(stray)} thread{'s' if len(stray) > 1 else ''} ({names}) "
               "that your code started and left running", err=True)
    _exit_now(code if isinstance(code, int) else 0 if code is None else 1)


def _stopped_outside_the_command(signum, frame) -> None:
    """SIGTERM or SIGINT before the command runs its work (while torch is imported) or after
    it: the workers started early ended, one ``Error:`` line, 143 or 130, as during the work
    (where the command's own handlers hold; click would say "Aborted!" and exit 1)."""
    early_workers.discard()
    _unlink_semaphores()
    what, code = _STOPPED[signum]
    with contextlib.suppress(OSError):
        os.write(2, b"Error: " + what + b"\n")
    os._exit(code)


def _finish(code: object) -> None:
    """Exit as ``sys.exit(code)`` would, without the interpreter tearing down every module
    and object one by one (about a second after a traced step: torch's caches, the traces
    kept for the batch search): the exit handlers it would run (the user's, multiprocessing's,
    logging's) run first."""
    if code is not None and not isinstance(code, int):
        click.echo(str(code), err=True)
        code = 1
    atexit._run_exitfuncs()   # noqa: SLF001 (what the interpreter's exit runs)
    _exit_now(code or 0)


def _exit_now(code: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):   # closed, or a reader that went away
            if stream is not None:
                stream.flush()
    os._exit(code)


def _unlink_semaphores() -> None:
    """What the interpreter's exit would do for multiprocessing, which ``os._exit`` skips:
    the ended worker pool's semaphores unlinked (their finalizers run), or the resource
    tracker reports them as leaked on stderr after the Error: line (seen once in a loaded
    suite run with ``gc.collect`` alone: the pool's queues were still referenced)."""
    gc.collect()
    multiprocessing.util._run_finalizers(0)   # noqa: SLF001 (what atexit runs, priority >= 0)


def _running_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate()
            if thread is not threading.main_thread() and not thread.daemon and thread.is_alive()]
