"""Ctrl-C at random moments of a library estimate never aborts the interpreter (a
KeyboardInterrupt raised inside torch's C++ used to: ``memcalc.trace.interrupts``)."""

import os
import signal
import subprocess
import sys

import pytest

from memcalc.trace.interrupts import DeferredInterrupts


@pytest.mark.slow
def test_a_hundred_random_interrupts_never_abort_and_leave_nothing():
    before = set(os.listdir("/dev/shm"))
    run = subprocess.run([sys.executable, "-m", "tests.fixtures.interrupts", "100", "7"],
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-2000:]
    interrupted = int(run.stdout.split()[1])
    assert interrupted >= 50                      # most tries were cut short inside memcalc
    assert not {name for name in set(os.listdir("/dev/shm")) - before if "torch" in name
                or name.startswith("sem.")}


def test_a_ctrl_c_inside_is_held_to_a_safe_point_then_given_to_the_callers_handler():
    received = []

    def callers(*_):
        received.append(True)

    before = signal.signal(signal.SIGINT, callers)
    try:
        with DeferredInterrupts() as interrupts:
            signal.raise_signal(signal.SIGINT)
            assert not received and interrupts.pending      # only noted
            interrupts.check()                               # a safe point
            assert received == [True]
            signal.raise_signal(signal.SIGINT)
        assert received == [True, True]                      # delivered on leaving
        assert signal.getsignal(signal.SIGINT) is callers
    finally:
        signal.signal(signal.SIGINT, before)


def test_a_ctrl_c_becomes_a_keyboard_interrupt_at_the_safe_point():
    with pytest.raises(KeyboardInterrupt):
        with DeferredInterrupts() as interrupts:
            signal.raise_signal(signal.SIGINT)
            interrupts.check()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
