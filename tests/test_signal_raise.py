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
    with pytest.raises(KeyboardInterrupt):
        raise_where_safe(signal.SIGUSR1, frame_in(__file__), KeyboardInterrupt())
