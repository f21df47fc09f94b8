"""Killing a probe's process group removes the shared memory its processes left in /dev/shm
(what PyTorch names after the creating pid), and nothing else."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest

from memcalc.host.measure import OWN_PROCESS_GROUP, kill_group
from memcalc.host.shm_leftovers import SHM_DIR, group_pids, remove_torch_shm

# a process and its child in its group, each leaving a file as a killed DataLoader worker can
CHILD = ("import os, sys, time; open(f'{sys.argv[1]}/torch_{os.getpid()}_123_0', 'wb')"
         ".write(b'x' * 4096); time.sleep(120)")
PARENT = ("import subprocess, sys; subprocess.Popen([sys.executable, '-c', sys.argv[2], "
          "sys.argv[1]]); exec(sys.argv[2])")


def _start(directory: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", PARENT, directory, CHILD],
                            **OWN_PROCESS_GROUP)


def _leftovers(directory) -> list[str]:
    return sorted(name for name in os.listdir(directory) if name.startswith("torch_"))


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="process groups are read from /proc")
def test_a_killed_group_leaves_no_shared_memory_and_others_keep_theirs(tmp_path, monkeypatch):
    theirs = tmp_path / f"torch_{os.getpid()}_9_0"      # a live process's, not in the group
    theirs.write_bytes(b"y")
    monkeypatch.setattr("memcalc.host.shm_leftovers.SHM_DIR", str(tmp_path))
    process = _start(str(tmp_path))
    deadline = time.monotonic() + 60
    while len(_leftovers(tmp_path)) < 3:
        assert time.monotonic() < deadline and process.poll() is None
        time.sleep(0.05)
    members = group_pids(process.pid)
    assert process.pid in members and len(members) == 2
    kill_group(process)
    assert _leftovers(tmp_path) == [theirs.name]
    assert all(_ended(pid) for pid in members)


def _ended(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE   # killed, not yet reaped
    except psutil.NoSuchProcess:
        return True


def test_only_files_named_after_the_given_pids_are_removed(tmp_path):
    for name in ("torch_41_1_0", "torch_41_2_7", "torch_410_1_0", "torch_42_1_0", "other_41"):
        (tmp_path / name).write_bytes(b"")
    removed = remove_torch_shm([41], str(tmp_path))
    assert sorted(os.path.basename(path) for path in removed) == ["torch_41_1_0", "torch_41_2_7"]
    assert sorted(os.listdir(tmp_path)) == ["other_41", "torch_410_1_0", "torch_42_1_0"]
    assert SHM_DIR == "/dev/shm"
