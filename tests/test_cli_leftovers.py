"""Processes left by the command: the running ones are ended and counted, the dead ones
(zombies, such as a killed probe's worker reparented to memcalc) reaped and not counted."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from memcalc.cli.leftovers import descendant_pids, end_new_descendants


def _wait_for_status(pid: int, status: str, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while psutil.Process(pid).status() != status:
        assert time.monotonic() < deadline, f"process {pid} never became {status}"
        time.sleep(0.02)


def test_a_running_process_is_ended_and_counted_a_dead_one_reaped_and_not():
    before = descendant_pids()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    _wait_for_status(dead.pid, psutil.STATUS_ZOMBIE)

    assert end_new_descendants(before) == 1

    assert running.wait(timeout=10) is not None
    assert not psutil.pid_exists(dead.pid)       # reaped: gone from the process table
    assert descendant_pids() - before == set()


def test_only_zombies_left_counts_none():
    before = descendant_pids()
    dead = [subprocess.Popen([sys.executable, "-c", "pass"]) for _ in range(2)]
    for process in dead:
        _wait_for_status(process.pid, psutil.STATUS_ZOMBIE)
    assert end_new_descendants(before) == 0
    assert all(not psutil.pid_exists(process.pid) for process in dead)
