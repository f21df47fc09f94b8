"""A signal's exception is raised where it can unwind: not in torch's code or a trace mode's
(called from C++), nor in a weak-reference callback or ``__del__`` (which drop it); there the
signal comes again shortly instead."""

from __future__ import annotations

import os
import signal
import sys
import time
import weakref

import pytest
import torch

from memcalc.cli import signal_raise
from memcalc.cli.signal_raise import raise_where_safe


def frame_in(filename: str, name: str = "<module>"):
    """A live frame whose code claims to come from ``filename``."""
    source = f"def {name}():\n    return sys._getframe()\n" if name != "<module>" else \
        "frame = sys._getframe()\n"
    scope = {"sys": sys}
    exec(compile(source, filename, "exec"), scope)
    return scope[name]() if name != "<module>" else scope["frame"]


TORCH_DIR = os.path.dirname(torch.__file__)


@pytest.mark.parametrize("frame, unsafe", [
    (lambda: frame_in(os.path.join(TORCH_DIR, "_subclasses", "fake_tensor.py")), True),
    (lambda: frame_in(os.path.join(signal_raise._TRACE_DIR, "_torch_internals.py")), True),
    (lambda: frame_in(weakref.__file__), True),
    (lambda: frame_in(__file__, "__del__"), True),
    (lambda: frame_in(__file__), False),                       # the user's or memcalc's code
    (lambda: frame_in(os.path.join("/home/me/torch", "model.py")), False),  # not torch's own
])
def test_frames_where_an_exception_cannot_unwind_are_told(frame, unsafe):
    assert signal_raise._inside_dispatch(frame()) is unsafe


def test_the_signal_comes_again_when_it_lands_in_torch_and_raises_elsewhere():
    arrived = []
    before = signal.signal(signal.SIGUSR1, lambda signum, frame: arrived.append(frame))
    try:
        raise_where_safe(signal.SIGUSR1, frame_in(os.path.join(TORCH_DIR, "nn", "x.py")),
                         KeyboardInterrupt())                   # not raised: sent again
        deadline = time.monotonic() + 5
        while not arrived and time.monotonic() < deadline:
            time.sleep(0.005)
        assert arrived
    finally:
        signal.signal(signal.SIGUSR1, before)
    try:
        with pytest.raises(KeyboardInterrupt):
            raise_where_safe(signal.SIGUSR1, frame_in(__file__), KeyboardInterrupt())
    finally:
        signal_raise.settle()


class Stop(BaseException):
    """A signal's exception, as ``Terminated`` is."""


RECHECK_S = 0.1
"""The rechecks' period in these tests (the CLI's is longer): the same steps, less waiting."""


@pytest.fixture
def stop_on_usr1(monkeypatch):
    """SIGUSR1 raises ``Stop`` where safe (as the CLI's SIGTERM handler does); each delivery is
    recorded. Whatever is still owed is settled after the test, as the guard would."""
    monkeypatch.setattr(signal_raise, "RECHECK_S", RECHECK_S)
    deliveries = []

    def handler(signum, frame):
        deliveries.append(time.monotonic())
        raise_where_safe(signum, frame, Stop())

    before = signal.signal(signal.SIGUSR1, handler)
    try:
        yield deliveries
    finally:
        signal_raise.settle()
        time.sleep(RECHECK_S + 0.2)         # a recheck sent meanwhile lands here
        signal.signal(signal.SIGUSR1, before)


def _signalled_and_swallowed() -> bool:
    """SIGUSR1 sent, and its exception lost in the user's ``except BaseException: pass`` (or in
    C code clearing the error)."""
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(5)
    except BaseException:       # noqa: BLE001 (the point of the test)
        return True
    return False


def test_an_exception_lost_where_it_was_raised_is_raised_again(stop_on_usr1):
    assert _signalled_and_swallowed()
    started = time.monotonic()
    with pytest.raises(Stop):
        try:
            time.sleep(5)
        finally:
            signal_raise.settle()       # caught: as the guard does
    assert time.monotonic() - started < 10 * RECHECK_S      # not the 5 s sleep
    assert len(stop_on_usr1) >= 2           # the signal came again


def test_the_work_ending_raises_what_it_lost(stop_on_usr1):
    assert _signalled_and_swallowed()
    with pytest.raises(Stop):
        try:
            signal_raise.raise_owed()
        finally:
            signal_raise.settle()


def test_cleanup_of_the_raised_exception_is_not_interrupted(stop_on_usr1):
    cleaned = []
    with pytest.raises(Stop):
        try:
            os.kill(os.getpid(), signal.SIGUSR1)
            time.sleep(5)
        finally:
            time.sleep(5 * RECHECK_S)     # the signal comes again meanwhile
            cleaned.append(True)
            signal_raise.settle()
    assert cleaned == [True] and len(stop_on_usr1) >= 2


def test_once_the_guard_has_it_the_signal_stops_coming(stop_on_usr1):
    with pytest.raises(Stop):
        try:
            os.kill(os.getpid(), signal.SIGUSR1)
            time.sleep(5)
        finally:
            signal_raise.settle()
    time.sleep(3 * RECHECK_S)
    assert len(stop_on_usr1) <= 2           # at most one sent just before the guard settled
    signal_raise.raise_owed()               # nothing owed: returns


def test_a_handler_put_back_never_meets_a_signal_sent_again(stop_on_usr1):
    assert _signalled_and_swallowed()                   # owed: it would come again
    met = []
    signal_raise.put_back(signal.SIGUSR1, lambda *_: met.append(True))
    time.sleep(3 * RECHECK_S)
    assert met == [] and len(stop_on_usr1) == 1
