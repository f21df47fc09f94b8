"""numpy buffers over the limit refused in the tracing thread's context only."""

import subprocess
import sys
import threading

import numpy as np
import pytest

from memcalc.trace.numpy_limit import numpy_buffer_limit

try:
    from numpy._core.multiarray import get_handler_name   # numpy 2
except ImportError:
    from numpy.core.multiarray import get_handler_name    # numpy 1


def test_a_buffer_over_the_limit_is_refused_and_named():
    with numpy_buffer_limit(1 << 20) as refused:
        small = np.ones(1 << 16)                      # 512 KiB: allowed
        with pytest.raises(MemoryError, match="Unable to allocate"):
            np.ones(1 << 18)                          # 2 MiB
        with pytest.raises(MemoryError):
            np.zeros((1 << 10, 1 << 9))               # calloc: 4 MiB
    assert refused == [2 << 20, 4 << 20]
    assert small.sum() == 1 << 16
    assert np.ones(1 << 18).nbytes == 2 << 20         # after it, numpy's own handler again


def test_only_the_tracing_threads_context_is_limited_and_restored():
    before = get_handler_name()
    seen = []
    with numpy_buffer_limit(1 << 20):
        inside = get_handler_name()
        thread = threading.Thread(target=lambda: seen.append((get_handler_name(),
                                                              np.ones(1 << 18).nbytes)))
        thread.start()
        thread.join()
    assert inside != before and get_handler_name() == before
    assert seen == [(before, 2 << 20)]


def test_a_refusal_inside_does_not_leave_the_limit_set():
    with pytest.raises(ValueError), numpy_buffer_limit(1 << 20):
        raise ValueError("the user's forward failed")
    assert np.ones(1 << 18).nbytes == 2 << 20


def test_arrays_made_under_the_limit_are_freed_safely_at_exit():
    """Their handler's free is numpy's own C function: nothing of Python runs when the
    interpreter frees them at exit (a Python callback there crashed the process)."""
    code = ("import numpy as np; from memcalc.trace.numpy_limit import numpy_buffer_limit\n"
            "with numpy_buffer_limit(1 << 20):\n"
            "    kept = [np.ones(1000) for _ in range(100)]\n"
            "grown = kept[0].copy(); kept[1].resize(1 << 19, refcheck=False)\n"
            "print(sum(a.size for a in kept))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == [str(99 * 1000 + (1 << 19))]
