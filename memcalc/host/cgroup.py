"""A memory cgroup for one measured run: RAM as the kernel charges it (anonymous memory,
shared memory such as /dev/shm batches in flight, page cache), what a SLURM job's cgroup
limit enforces.

``MemoryCgroup`` creates a fresh child of this process's own memory cgroup (v1 or v2), caps
it when asked, runs a command inside it (``wrap``: the process joins before it execs, so
everything it allocates is charged there), reads its peak and whether the OOM killer fired,
and on exit kills what is left in it and removes it. Where no child can be created (no
memory controller, a read-only hierarchy, cgroup v2 with processes in this cgroup) it
raises ``CgroupUnavailable`` with the reason.

Known limitations: file pages already in the page cache stay charged to the cgroup that read
them first, so a run's peak counts only the cache it reads first; a cgroup left behind by a
memcalc that was killed (SIGKILL) is removed by the next one made in the same place.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import signal
import time

from memcalc.errors import MemcalcError

PROC_CGROUP = "/proc/self/cgroup"
PROC_MOUNTINFO = "/proc/self/mountinfo"
NAME_PREFIX = "memcalc-"
EMPTY_SECONDS = 10.0
"""How long to wait for killed processes to leave the cgroup before giving up on removing it."""

_FILES = {
    1: {"peak": "memory.max_usage_in_bytes", "usage": "memory.usage_in_bytes",
        "limit": "memory.limit_in_bytes", "swap_limit": "memory.memsw.limit_in_bytes"},
    2: {"peak": "memory.peak", "usage": "memory.current", "limit": "memory.max",
        "swap_limit": "memory.swap.max"},
}


class CgroupUnavailable(MemcalcError):
    """No memory cgroup can be created here; the message says why."""


def own_memory_cgroup(proc_cgroup: str = PROC_CGROUP,
                      mountinfo: str = PROC_MOUNTINFO) -> tuple[str, int]:
    """The directory of this process's memory cgroup and the hierarchy's version (1 or 2)."""
    lines = _read(proc_cgroup, "which cgroup this process is in").splitlines()
    entries = [line.split(":", 2) for line in lines if line.count(":") >= 2]
    mounts = _cgroup_mounts(mountinfo)
    for _, controllers, path in entries:
        if "memory" in controllers.split(","):
            mount = next((m for m in mounts if m[2] == "cgroup" and "memory" in m[3]), None)
            if mount is None:
                raise CgroupUnavailable("the cgroup v1 memory controller is not mounted")
            return _join(mount, path), 1
    for _, controllers, path in entries:
        if controllers == "":
            mount = next((m for m in mounts if m[2] == "cgroup2"), None)
            if mount is None:
                raise CgroupUnavailable("cgroup v2 is not mounted")
            return _join(mount, path), 2
    raise CgroupUnavailable("this process is in no memory cgroup (no memory controller)")


class MemoryCgroup:
    """A fresh memory cgroup, child of this process's own; a context manager that removes it.

    ``limit_bytes`` caps it: past the cap the kernel reclaims page cache, then OOM-kills a
    process inside. ``kill_on_exit`` False moves what is left to the parent instead."""

    def __init__(self, limit_bytes: int | None = None, kill_on_exit: bool = True,
                 parent: tuple[str, int] | None = None) -> None:
        self.parent, self.version = parent or own_memory_cgroup()
        self.kill_on_exit, self.limit_bytes = kill_on_exit, limit_bytes
        self.files = _FILES[self.version]
        if self.version == 2:
            _enable_memory_controller(self.parent)
        _remove_stale(self.parent)
        self.path = os.path.join(self.parent, f"{NAME_PREFIX}{os.getpid()}-{secrets.token_hex(4)}")
        try:
            os.mkdir(self.path)
        except OSError as error:
            raise CgroupUnavailable(f"cannot create a memory cgroup in {self.parent}: "
                                    f"{error.strerror or error}") from None
        try:
            if not os.path.exists(self._file("peak")):
                raise CgroupUnavailable(f"{self.files['peak']} is missing (cgroup v2 has it "
                                        "from Linux 5.19)")
            if limit_bytes is not None:
                self._write("limit", str(int(limit_bytes)))
                with contextlib.suppress(OSError):   # no swap accounting: nothing to cap
                    self._write("swap_limit", "0" if self.version == 2 else str(int(limit_bytes)))
        except BaseException:
            self.close()
            raise

    @property
    def description(self) -> str:
        return f"memory cgroup (v{self.version})"

    def __enter__(self) -> MemoryCgroup:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def add(self, pid: int) -> None:
        """Move a process in (its memory charged so far stays where it was)."""
        self._write("procs", str(pid))

    def join(self) -> None:
        """Move the calling process in: for ``subprocess.Popen(preexec_fn=cgroup.join)``."""
        fd = os.open(self._file("procs"), os.O_WRONLY)
        try:
            os.write(fd, str(os.getpid()).encode())
        finally:
            os.close(fd)

    def wrap(self, command: list[str]) -> list[str]:
        """``command`` run so that it joins this cgroup before it execs (a shell writes its
        own pid, then becomes the command): safe where ``preexec_fn`` is not (threads)."""
        return ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', self._file("procs"), *command]

    def pids(self) -> list[int]:
        try:
            return [int(pid) for pid in _read(self._file("procs"), "").split()]
        except CgroupUnavailable:
            return []

    def peak_bytes(self) -> int:
        """The largest charge since creation: anonymous memory, shared memory, page cache."""
        return int(_read(self._file("peak"), "the cgroup's peak"))

    def usage_bytes(self) -> int:
        return int(_read(self._file("usage"), "the cgroup's usage"))

    def file_cache_bytes(self) -> int:
        """Page cache of files charged here now (not shared memory): reclaimable, and part of
        the peak when the run read files."""
        stat = dict(line.split() for line in _read(os.path.join(self.path, "memory.stat"),
                                                   "the cgroup's memory.stat").splitlines()
                    if len(line.split()) == 2)
        cache = int(stat.get("cache" if self.version == 1 else "file", 0))
        return max(0, cache - int(stat.get("shmem", 0)))

    def oom_kills(self) -> int:
        """Processes the OOM killer ended in this cgroup (Linux 4.13+; 0 where not said)."""
        name = "memory.oom_control" if self.version == 1 else "memory.events"
        try:
            text = _read(os.path.join(self.path, name), "")
        except CgroupUnavailable:
            return 0
        found = re.search(r"^oom_kill (\d+)$", text, re.MULTILINE)
        return int(found.group(1)) if found else 0

    def close(self) -> None:
        """Kill (or move to the parent) what is left inside, then remove the cgroup."""
        if not os.path.isdir(self.path):
            return
        deadline = time.monotonic() + EMPTY_SECONDS
        while self.pids() and time.monotonic() < deadline:
            for pid in self.pids():
                with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
                    if self.kill_on_exit:
                        os.kill(pid, signal.SIGKILL)
                    else:
                        _write_file(os.path.join(self.parent, "cgroup.procs"), str(pid))
            time.sleep(0.01)
        while True:
            try:
                os.rmdir(self.path)
                return
            except FileNotFoundError:
                return
            except OSError as error:   # EBUSY while exiting processes are still charged
                if error.errno != errno.EBUSY or time.monotonic() > deadline:
                    raise
                time.sleep(0.02)

    def _file(self, key: str) -> str:
        name = "cgroup.procs" if key == "procs" else self.files[key]
        return os.path.join(self.path, name)

    def _write(self, key: str, value: str) -> None:
        _write_file(self._file(key), value)


def _enable_memory_controller(parent: str) -> None:
    """cgroup v2 gives a child the memory controller only through the parent's
    ``cgroup.subtree_control``, which it refuses while the parent holds processes."""
    available = _read(os.path.join(parent, "cgroup.controllers"), "the cgroup's controllers")
    if "memory" not in available.split():
        raise CgroupUnavailable(f"the memory controller is not delegated to {parent}")
    control = os.path.join(parent, "cgroup.subtree_control")
    if "memory" in _read(control, "the cgroup's subtree_control").split():
        return
    try:
        _write_file(control, "+memory")
    except OSError as error:
        reason = ("cgroup v2 forbids it in a cgroup that holds processes (run memcalc from a "
                  "leaf of its own, e.g. systemd-run --user --scope -p Delegate=yes)"
                  if error.errno == errno.EBUSY else error.strerror or str(error))
        raise CgroupUnavailable(f"cannot enable the memory controller in {parent}: "
                                f"{reason}") from None


def _remove_stale(parent: str) -> None:
    """Empty cgroups left by a memcalc that was killed before it could remove them."""
    with contextlib.suppress(OSError):
        for name in os.listdir(parent):
            owner = re.fullmatch(rf"{NAME_PREFIX}(\d+)-[0-9a-f]+", name)
            if owner and not os.path.exists(f"/proc/{owner.group(1)}"):
                with contextlib.suppress(OSError):
                    os.rmdir(os.path.join(parent, name))


def _cgroup_mounts(mountinfo: str) -> list[tuple[str, str, str, str]]:
    """(mount point, root inside the hierarchy, fstype, super options) of cgroup mounts."""
    mounts = []
    for line in _read(mountinfo, "the mount table").splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        tail = fields[fields.index("-") + 1:]
        if len(tail) >= 3 and tail[0] in ("cgroup", "cgroup2"):
            mounts.append((fields[4], fields[3], tail[0], tail[2]))
    return mounts


def _join(mount: tuple[str, str, str, str], path: str) -> str:
    point, root = mount[0], mount[1]
    if root != "/" and (path == root or path.startswith(root + "/")):
        path = path[len(root):]
    return os.path.join(point, path.lstrip("/")).rstrip("/") or point


def _read(path: str, what: str) -> str:
    try:
        with open(path) as handle:
            return handle.read()
    except OSError as error:
        raise CgroupUnavailable(f"cannot read {what or path}: {error.strerror or error}") from None


def _write_file(path: str, value: str) -> None:
    with open(path, "w") as handle:
        handle.write(value)
