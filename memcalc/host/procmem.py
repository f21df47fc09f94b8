"""Memory of real processes, read from ``/proc`` (Linux): PSS, USS and shared memory in use."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass

import psutil

_KIB = 1024
SHM_PATH = "/dev/shm"


@dataclass(frozen=True)
class ProcessMemory:
    """One process's memory in bytes. PSS splits each shared page between its sharers, so the
    PSS of a process tree counts every page once; USS is what exiting the process would free."""

    rss_bytes: int
    pss_bytes: int
    uss_bytes: int
    pss_shmem_bytes: int

    @property
    def pss_private_bytes(self) -> int:
        """PSS without mapped shared-memory segments (those are counted by the tmpfs)."""
        return self.pss_bytes - self.pss_shmem_bytes


def process_memory(pid: int) -> ProcessMemory:
    """Read ``/proc/PID/smaps_rollup``; raises ``psutil.NoSuchProcess`` when it has exited."""
    fields: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as rollup:
            for line in rollup:
                name, _, rest = line.partition(":")
                parts = rest.split()
                if len(parts) == 2 and parts[1] == "kB":
                    fields[name] = int(parts[0]) * _KIB
    except (FileNotFoundError, ProcessLookupError) as error:
        raise psutil.NoSuchProcess(pid) from error
    return ProcessMemory(
        rss_bytes=fields.get("Rss", 0), pss_bytes=fields.get("Pss", 0),
        uss_bytes=fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0),
        pss_shmem_bytes=fields.get("Pss_Shmem", 0))


def tree_pids(root_pid: int) -> list[int]:
    """The process and its live descendants (DataLoader workers, their helpers)."""
    try:
        root = psutil.Process(root_pid)
        return [root_pid, *(child.pid for child in root.children(recursive=True))]
    except psutil.NoSuchProcess:
        return []


def tree_memory(root_pid: int) -> dict[int, ProcessMemory]:
    """Memory of every live process in the tree; processes exiting meanwhile are skipped."""
    memory = {}
    for pid in tree_pids(root_pid):
        try:
            memory[pid] = process_memory(pid)
        except psutil.NoSuchProcess:
            continue
    return memory


def shm_used_bytes(path: str = SHM_PATH) -> int:
    """Bytes in use on the shared-memory tmpfs, including unlinked segments still open
    (how DataLoader workers hand batches to the main process)."""
    if not os.path.isdir(path):
        return 0
    return shutil.disk_usage(path).used


def host_total_bytes(root_pid: int, shm_baseline_bytes: int = 0) -> int:
    """RAM a process tree holds: private PSS of its processes plus shared memory it created
    (``shm_used_bytes`` above ``shm_baseline_bytes``), each page once."""
    private = sum(memory.pss_private_bytes for memory in tree_memory(root_pid).values())
    return private + max(0, shm_used_bytes() - shm_baseline_bytes)
