"""/proc readings against allocations of known size."""

import multiprocessing
import os

import torch

from memcalc.host.procmem import (
    host_total_bytes,
    process_memory,
    shm_used_bytes,
    tree_memory,
)

MIB = 1 << 20


_LEAN_CHILD = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("procmem", sys.argv[1])
procmem = sys.modules["procmem"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(procmem)
before = procmem.process_memory(procmem.os.getpid())
block = bytearray(64 << 20)            # zero-filled: every page touched
after = procmem.process_memory(procmem.os.getpid())
print(json.dumps([after.pss_bytes - before.pss_bytes, after.uss_bytes - before.uss_bytes]))
"""


def test_pss_grows_by_what_is_allocated_and_touched():
    # Read in a lean child (no torch): PSS divides shared pages among the processes mapping
    # them, so in a process holding ~700 MB of torch's libraries, any other torch process
    # starting or ending between two readings moves PSS by tens of MiB
    import json
    import subprocess
    import sys

    import memcalc.host.procmem as procmem

    result = subprocess.run([sys.executable, "-c", _LEAN_CHILD, procmem.__file__],
                            capture_output=True, text=True, timeout=60, check=True)
    pss_growth, uss_growth = json.loads(result.stdout)
    assert abs(pss_growth - 64 * MIB) < 4 * MIB
    assert abs(uss_growth - 64 * MIB) < 4 * MIB


def test_shared_memory_segments_are_counted_once_by_the_tmpfs():
    # the tensor exists before the first reading: share_memory_() moves its storage to the
    # tmpfs, and whether glibc hands the private copy back depends on the suite's earlier
    # allocations (its mmap threshold), not on how the tmpfs is counted
    private = torch.ones(32 * MIB, dtype=torch.uint8)
    before_shm, before_total = shm_used_bytes(), host_total_bytes(os.getpid())
    shared = private.share_memory_()
    grew = shm_used_bytes() - before_shm
    assert abs(grew - 32 * MIB) < 2 * MIB
    mapped = process_memory(os.getpid())
    assert mapped.pss_shmem_bytes >= 30 * MIB   # mapped here, so also in PSS...
    total = host_total_bytes(os.getpid(), before_shm)
    assert total - before_total < 32 * MIB + 8 * MIB   # ...but the total has it once
    del shared


def _hold(ready, release):
    block = bytearray(48 * MIB)
    ready.set()
    release.wait(30)
    del block


def test_tree_memory_includes_children():
    context = multiprocessing.get_context("fork")
    ready, release = context.Event(), context.Event()
    child = context.Process(target=_hold, args=(ready, release))
    child.start()
    try:
        assert ready.wait(30)
        memory = tree_memory(os.getpid())
        assert child.pid in memory and os.getpid() in memory
        assert memory[child.pid].uss_bytes > 48 * MIB
    finally:
        release.set()
        child.join()
