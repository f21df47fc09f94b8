"""What a process that sleeps waits for a CPU when it wakes and every core is busy, measured
on this machine: the feeding model's ``wake`` for a training step that sleeps while workers
keep every core busy.

Whether a waking process runs at once or waits for the running one's slice or the next tick
depends on the kernel (its scheduler, preemption model and tick rate), so it is measured, not
assumed: one busy-looping process per core, and this thread sleeps and wakes ``WAKE_ROUNDS``
times, each wake-up's wait for a CPU read from ``/proc/TID/schedstat`` (where the
kernel has none, the oversleep stands in). Measured on 2 cores (Linux 6.18, EEVDF, 250 Hz):
0.3-0.6 ms on average, most wake-ups preempting a busy process at once.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import threading
import time

from memcalc.host.machine import cpu_wait_seconds

WAKE_ROUNDS = 40
SLEEP_S = 0.005
"""Each round's sleep: long enough for the busy processes to hold every core again."""
WORK_S = 0.001
"""CPU time spent between wake-ups, as a training loop takes its batch."""
SETTLE_S = 0.1
"""Time given to the busy processes to start before the first round."""
_BUSY_LOOP = "while True:\n    pass\n"


def spin(seconds: float) -> None:
    """Keep a core busy for ``seconds`` of wall time (a training process spin-waiting on CUDA;
    the waits measured here)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def wake_wait_s(cpus: int) -> tuple[float, str]:
    """The mean wait for a CPU at a wake-up with ``cpus`` other processes busy, and how it was
    measured. The busy processes are always stopped, whatever happens meanwhile."""
    busy = [subprocess.Popen([sys.executable, "-S", "-c", _BUSY_LOOP],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
            for _ in range(max(1, cpus))]
    try:
        time.sleep(SETTLE_S)
        waits, source = _rounds(threading.get_native_id())
    finally:
        for process in busy:
            process.kill()
        for process in busy:
            process.wait()
    return statistics.mean(waits), (
        f"measured: mean of {WAKE_ROUNDS} wake-ups with {max(1, cpus)} busy processes, {source}")


def _rounds(thread: int) -> tuple[list[float], str]:
    waits, oversleeps = [], []
    for _ in range(WAKE_ROUNDS):
        before, start = cpu_wait_seconds(thread), time.perf_counter()
        time.sleep(SLEEP_S)
        oversleeps.append(max(0.0, time.perf_counter() - start - SLEEP_S))
        after = cpu_wait_seconds(thread)
        if None not in (before, after):
            waits.append(after - before)
        spin(WORK_S)
    if len(waits) == WAKE_ROUNDS:
        return waits, "the kernel's run-queue wait (schedstat)"
    return oversleeps, "oversleep (no schedstat)"
