"""Shared memory that killed DataLoader processes leave in /dev/shm, removed.

PyTorch moves a tensor to shared memory by creating ``/dev/shm/torch_<pid>_<random>_<n>``
(``at::NewProcessWideShmHandle``, named after the creating process), mapping it and removing
the name at once. A process killed between the two leaves the file behind, and its RAM stays
used until the node reboots (two 80 MiB ones were found on a test machine after a day of
test runs that killed probes). memcalc kills its probes and verify runs as a process group;
it then removes the files named after that group's processes. Nothing else can need them:
with the default ``file_descriptor`` sharing strategy the receivers hold descriptors, not
names, and every process of the group is gone.

Known limitations: a worker that died before the kill (the OOM killer in a capped verify run)
is no longer in the group, so what it left is not found; Linux only (elsewhere nothing is
listed).
"""

from __future__ import annotations

import contextlib
import glob
import os

SHM_DIR = "/dev/shm"


def group_pids(pgid: int) -> list[int]:
    """The processes in process group ``pgid`` now (from ``/proc``; none where it is missing)."""
    pids = []
    with contextlib.suppress(OSError):
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    stat = handle.read()
            except OSError:     # exited meanwhile
                continue
            fields = stat.rsplit(")", 1)[-1].split()   # state, ppid, pgrp, ... after the name
            if len(fields) > 2 and int(fields[2]) == pgid:
                pids.append(int(entry))
    return pids


def remove_torch_shm(pids: list[int], directory: str | None = None) -> list[str]:
    """Remove the shared-memory files PyTorch names after ``pids`` (in ``SHM_DIR`` unless
    ``directory``); the paths removed."""
    removed = []
    for pid in pids:
        for path in glob.glob(os.path.join(directory or SHM_DIR, f"torch_{pid}_*")):
            with contextlib.suppress(OSError):
                os.unlink(path)
                removed.append(path)
    return removed
