"""The machine the job will run on: given figures, or this machine's CPUs and memory limits
(CPU affinity, cgroup v1/v2 memory and CPU limits, ``/dev/shm``)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import psutil

from memcalc.errors import InputError
from memcalc.host.procmem import SHM_PATH
from memcalc.host.specs import MachineSpec

_UNLIMITED = 1 << 60   # cgroup v1 writes a huge number for "no limit"


def machine_from_options(cpus: int | None, ram_bytes: int | None, mem_per_cpu_bytes: int | None,
                         shm_bytes: int | None, root: str = "/") -> MachineSpec:
    """Given figures win; what is not given is detected on this machine."""
    if mem_per_cpu_bytes is not None and cpus is None:
        raise InputError("--mem-per-cpu needs --cpus: the job's limit is the two multiplied "
                         "(SLURM --mem-per-cpu × --cpus-per-task)")
    for name, value in (("--cpus", cpus), ("--ram", ram_bytes), ("--shm", shm_bytes)):
        if value is not None and value <= 0:
            raise InputError(f"{name} must be positive, got {value}")
    if cpus is not None and (ram_bytes is not None or mem_per_cpu_bytes is not None):
        return MachineSpec(cpus=cpus, ram_bytes=ram_bytes or mem_per_cpu_bytes * cpus,
                           mem_per_cpu_bytes=mem_per_cpu_bytes, shm_bytes=shm_bytes)
    detected = detect_machine(root)
    given = cpus is not None or ram_bytes is not None or shm_bytes is not None
    return MachineSpec(
        cpus=cpus or detected.cpus, ram_bytes=ram_bytes or detected.ram_bytes,
        mem_per_cpu_bytes=mem_per_cpu_bytes,
        shm_bytes=shm_bytes or (detected.shm_bytes if ram_bytes is None else None),
        source="given and detected" if given else detected.source)


def detect_machine(root: str = "/") -> MachineSpec:
    """This machine: usable CPUs and the tightest memory limit that applies to this process."""
    base = Path(root)
    cpus = _cpu_count(base)
    ram = psutil.virtual_memory().total if root == "/" else _meminfo_total(base)
    limit = _cgroup_memory_limit(base)
    shm_dir = base / SHM_PATH.lstrip("/")
    shm = _tmpfs_size(shm_dir) if shm_dir.is_dir() else None
    source = "detected (cgroup limit)" if limit and limit < ram else "detected"
    return MachineSpec(cpus=cpus, ram_bytes=min(ram, limit) if limit else ram, shm_bytes=shm,
                       source=source)


def _cpu_count(base: Path) -> int:
    """CPUs this process may run on (affinity), capped by a cgroup CPU quota."""
    try:
        cpus = len(os.sched_getaffinity(0)) if str(base) == "/" else os.cpu_count() or 1
    except AttributeError:
        cpus = os.cpu_count() or 1
    quota = _cgroup_cpu_quota(base)
    return max(1, min(cpus, quota)) if quota else cpus


def _cgroup_dirs(base: Path, controller: str) -> list[Path]:
    """Directories that hold this process's cgroup files for ``controller`` (v2 first)."""
    dirs = []
    cgroup_file = base / "proc/self/cgroup"
    lines = cgroup_file.read_text().splitlines() if cgroup_file.exists() else []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        relative = path.lstrip("/")
        if controllers == "":   # cgroup v2 unified hierarchy
            dirs += [base / "sys/fs/cgroup" / relative, base / "sys/fs/cgroup"]
        elif controller in controllers.split(","):
            dirs += [base / "sys/fs/cgroup" / controller / relative,
                     base / "sys/fs/cgroup" / controller]
    return dirs


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().split()[0]
    except (OSError, IndexError):
        return None
    return int(text) if text.isdigit() else None


def _cgroup_memory_limit(base: Path) -> int | None:
    for directory in _cgroup_dirs(base, "memory"):
        for name in ("memory.max", "memory.limit_in_bytes"):
            value = _read_int(directory / name)
            if value is not None and value < _UNLIMITED:
                return value
    return None


def _cgroup_cpu_quota(base: Path) -> int | None:
    """Whole CPUs allowed by ``cpu.max`` (v2) or ``cfs_quota_us / cfs_period_us`` (v1)."""
    for directory in _cgroup_dirs(base, "cpu"):
        cpu_max = directory / "cpu.max"
        if cpu_max.exists():
            quota, _, period = cpu_max.read_text().strip().partition(" ")
            if quota.isdigit() and period.isdigit():
                return max(1, int(quota) // int(period))
            return None
        quota = _read_int(directory / "cpu.cfs_quota_us")
        period = _read_int(directory / "cpu.cfs_period_us")
        if quota and period:
            return max(1, quota // period)
    return None


def _meminfo_total(base: Path) -> int:
    for line in (base / "proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise InputError(f"no MemTotal in {base / 'proc/meminfo'}")


def _tmpfs_size(path: Path) -> int | None:
    try:
        stats = os.statvfs(path)
    except OSError:
        return None
    return stats.f_blocks * stats.f_frsize or None


def other_busy_cpus(seconds: float) -> float:
    """Cores kept busy over ``seconds`` by processes other than this one and its children
    (``OtherLoad``; this process sleeps meanwhile), 0 where it cannot be read."""
    import time

    with OtherLoad() as load:
        time.sleep(seconds)
    return load.busy_cpus


def _stat_ticks() -> tuple[int, int]:
    """All and idle (idle + iowait) CPU ticks since boot, from ``/proc/stat``."""
    with open("/proc/stat") as stat:
        ticks = [int(field) for field in stat.readline().split()[1:]]
    return sum(ticks), ticks[3] + ticks[4]


class OtherLoad:
    """Cores other processes keep busy while a ``with`` block runs: the machine's busy time
    (``/proc/stat``) less the CPU time of this process and of its children alive at both
    ends (``psutil``), over the block's wall time; 0 where it cannot be read."""

    def __enter__(self) -> OtherLoad:
        self._start = self._snapshot()
        self.busy_cpus = 0.0
        return self

    def __exit__(self, *_exc) -> None:
        end = self._snapshot()
        if self._start is None or end is None:
            return
        (wall_0, total_0, idle_0, own_0), (wall_1, total_1, idle_1, own_1) = self._start, end
        if total_1 <= total_0 or wall_1 <= wall_0:
            return
        machine = _cpu_count(Path("/")) * (1 - (idle_1 - idle_0) / (total_1 - total_0))
        own = sum(own_1[pid] - own_0[pid] for pid in own_1.keys() & own_0.keys())
        self.busy_cpus = max(0.0, machine - own / (wall_1 - wall_0))

    @staticmethod
    def _snapshot() -> tuple[float, int, int, dict[int, float]] | None:
        import time

        me = psutil.Process()
        own = {}
        for process in [me, *me.children(recursive=True)]:
            try:
                times = process.cpu_times()
                own[process.pid] = times.user + times.system
            except psutil.Error:        # exited meanwhile
                continue
        try:
            total, idle = _stat_ticks()
        except (OSError, ValueError, IndexError):
            return None
        return time.monotonic(), total, idle, own


def minor_faults(pid: int) -> int | None:
    """Page faults the process has taken that mapped a page without reading storage
    (``/proc/PID/stat``'s minflt): each is a fresh page the kernel zeroed or a shared page
    mapped in. None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[7])
    except (OSError, ValueError, IndexError):
        return None


def huge_page_faults() -> tuple[int, int] | None:
    """Transparent huge pages the kernel has faulted in, machine-wide (``/proc/vmstat``'s
    thp_fault_alloc; each also counts once in its process's minflt), and their size; None
    where the kernel does not say."""
    try:
        with open("/proc/vmstat") as vmstat:
            counts = dict(line.split() for line in vmstat if line.startswith("thp_fault_alloc "))
        size = Path("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size")
        return int(counts["thp_fault_alloc"]), int(size.read_text()) if size.exists() else 2 << 20
    except (OSError, ValueError, KeyError):
        return None


def fault_counts(pid: int) -> tuple[int, int, int] | None:
    """The process's minor faults, the machine's huge-page faults and the huge page's size
    (``fresh_bytes`` of two of them); None where the process's cannot be read."""
    minor, huge = minor_faults(pid), huge_page_faults()
    return None if minor is None else (minor, *(huge or (0, 0)))


def fresh_bytes(before: tuple[int, int, int] | None, after: tuple[int, int, int] | None
                 ) -> int | None:
    """Memory a process mapped afresh between two ``fault_counts``: each minor fault a page,
    those that were huge pages the rest of a huge page (counted machine-wide: right where the
    process watched is the one mapping them)."""
    if before is None or after is None:
        return None
    page = os.sysconf("SC_PAGE_SIZE")
    huge = max(0, after[1] - before[1])
    return (after[0] - before[0]) * page + huge * max(0, after[2] - page)


def cpu_wait_seconds(pid: int) -> float | None:
    """Seconds the process's main thread has spent runnable but waiting for a CPU, from
    ``/proc/PID/schedstat`` (its second field, in ns; the kernel's scheduler statistics);
    None where it cannot be read. Wall time less this is the time the thread would have
    taken with a core to itself."""
    times = cpu_run_and_wait_seconds(pid)
    return None if times is None else times[1]


def cpu_run_and_wait_seconds(pid: int) -> tuple[float, float] | None:
    """Seconds the process's main thread has run on a CPU and waited for one
    (``/proc/PID/schedstat``'s first two fields); None where they cannot be read."""
    try:
        with open(f"/proc/{pid}/schedstat") as stat:
            fields = stat.read().split()
        return int(fields[0]) / 1e9, int(fields[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def core_seconds(action: Callable[[], object]) -> float:
    """This thread's time with a core to itself over ``action()`` (``core_time``). What
    ``action`` returns is dropped inside the timing: freeing a batch is the training loop's
    cost too."""
    import threading
    import time

    thread = threading.get_native_id()
    start, before = time.perf_counter(), cpu_run_and_wait_seconds(thread)
    action()
    elapsed, after = time.perf_counter() - start, cpu_run_and_wait_seconds(thread)
    if None in (before, after):
        return elapsed
    return core_time(elapsed, after[0] - before[0], after[1] - before[1])


def core_time(elapsed: float, ran: float, waited: float) -> float:
    """An interval's time with a core to itself: ``elapsed`` less the ``waited`` for a CPU,
    never less than the CPU time it ``ran`` (a wait the kernel books late, or counts twice as
    under a CPU quota, must not make work cost less than itself) and never more than
    ``elapsed``."""
    return min(elapsed, max(elapsed - waited, ran))
