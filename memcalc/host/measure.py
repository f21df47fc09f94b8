"""Measured host analysis: run the real Dataset in a real worker (``memcalc.host.probe``),
find why a worker grows, and measure again with the fix when one applies."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

from memcalc.errors import InputError, UserCodeError
from memcalc.host.workers import (
    MALLOC_FIX_ENV,
    MMAP_THRESHOLD_MAX_BYTES,
    MMAP_THRESHOLD_MIN_BYTES,
    host_estimate,
)
from memcalc.host.report import HostFix, HostReport, WorkerMeasurement, env_text
from memcalc.host.shm_leftovers import group_pids, remove_torch_shm
from memcalc.host.specs import HostSpec, LoaderSpec
from memcalc.units import format_bytes

OWN_PROCESS_GROUP = ({"process_group": 0} if sys.version_info >= (3, 11)
                      else {"preexec_fn": os.setpgrp})
Progress = Callable[[str, int, int], None]
"""Told the probe's phase (``building``, ``memory``, ``timing``), batches measured so far and
the worker's latest private bytes."""
"""Called after each measured batch with (batches so far, worker bytes)."""
GROWTH_FLOOR_BYTES = 64 << 20
STARTUP_SECONDS = 120
"""Allowed for the probe to start: import torch and the user's module, build the Dataset."""
LATE_SECONDS = 20
"""Allowed past ``--probe-seconds`` for a batch in flight and the probe's shutdown."""


class MeasurementError(UserCodeError):
    """The user's Dataset failed in the measuring process."""


def measure_worker(loader: LoaderSpec, batch_size: int, env: dict[str, str] | None = None,
                   progress: Progress | None = None, parent_heap: str = "fresh"
                   ) -> WorkerMeasurement:
    """Start ``memcalc.host.probe`` in a fresh interpreter and read its events; its heap
    ``fresh`` (as the interpreter starts) or ``training`` (as a training script leaves it
    when it starts its workers: ``probe.TRAINING_HEAP_BLOCK_BYTES``)."""
    if loader.dataset is None:
        raise InputError("no --dataset given to measure")
    config = {"dataset": loader.dataset, "batch_size": batch_size,
              "prefetch_factor": loader.prefetch_factor, "input_key": loader.input_key,
              "start_method": loader.start_method.value, "seconds": loader.probe_seconds,
              "parent_heap": parent_heap}
    with tempfile.TemporaryFile() as output:
        process, read_fd = start_child("memcalc.host.probe", config, output, env)
        try:
            result = _read_events(read_fd, loader, progress, process.pid)
        finally:
            os.close(read_fd)
            kill_group(process)
        output.seek(0)
        stderr = output.read().decode(errors="replace")
    if result is None:
        last = stderr.strip().splitlines()[-1] if stderr.strip() else f"exit {process.returncode}"
        raise MeasurementError(f"measuring dataset {loader.dataset!r} stopped: {last}")
    result.pop("event")
    return WorkerMeasurement.model_validate(result)


def measured_host_estimate(spec: HostSpec, measured: WorkerMeasurement | None = None,
                           progress: Progress | None = None) -> HostReport:
    """Measure one worker (unless ``measured`` is given); when it keeps growing and glibc's
    heap is the likely cause, measure again with ``MALLOC_MMAP_THRESHOLD_`` set and report both."""
    if measured is None:
        measured = measure_worker(spec.loader, spec.batch_size, progress=progress)
    spec = with_measured_sample(spec, measured)
    report = host_estimate(spec, measured)
    growth = measured.worker_peak_bytes - measured.worker_first_bytes
    if growth <= max(GROWTH_FLOOR_BYTES, measured.batch_bytes):
        return report
    warnings = [f"the worker grew by {format_bytes(growth)} over {measured.batches} batches "
                f"({format_bytes(measured.worker_first_bytes)} after the first)"
                + (" and was still growing: the figure is a lower bound"
                   if measured.stopped_by != "plateau" else "")]
    if _glibc_heap_suspect(measured):
        fixed = measure_worker(spec.loader, measured.batch_size, env=MALLOC_FIX_ENV,
                               progress=progress)
        fixed_report = host_estimate(spec, fixed)
        if fixed.worker_peak_bytes < measured.worker_peak_bytes * 0.8:
            cause = ("glibc's dynamic mmap threshold: after a large buffer is freed, later "
                     f"buffers up to {format_bytes(MMAP_THRESHOLD_MAX_BYTES)} come from the heap, "
                     "which fragments and is not returned")
            warnings.append(f"cause: {cause}; with {env_text(MALLOC_FIX_ENV)} a worker needs "
                            f"{format_bytes(fixed_report.per_worker_bytes)} instead of "
                            f"{format_bytes(report.per_worker_bytes)}")
            fix = HostFix(cause=cause, env=MALLOC_FIX_ENV, per_worker_bytes=fixed_report.per_worker_bytes,
                          max_num_workers=fixed_report.max_num_workers, measurement=fixed)
            return report.model_copy(update={"fix": fix, "warnings": report.warnings + warnings})
    if measured.dataset_bytes and growth <= 1.5 * measured.dataset_bytes:
        warnings.append(f"cause: the worker copies the dataset object "
                        f"({format_bytes(measured.dataset_bytes)}) page by page as it reads it "
                        "(reference counts of Python objects); hold it in numpy arrays or tensors")
    else:
        warnings.append("cause not identified: not the dataset object's size and not glibc's "
                        "heap; look for caches or leaks in __getitem__")
    return report.model_copy(update={"warnings": report.warnings + warnings})


def _glibc_heap_suspect(measured: WorkerMeasurement) -> bool:
    """Samples big enough to be mmapped at first, small enough to land in the heap later."""
    return (platform.libc_ver()[0] == "glibc" and "MALLOC_MMAP_THRESHOLD_" not in measured.malloc_env
            and MMAP_THRESHOLD_MIN_BYTES < measured.sample_bytes <= 2 * MMAP_THRESHOLD_MAX_BYTES)


def with_measured_sample(spec: HostSpec, measured: WorkerMeasurement) -> HostSpec:
    """The spec with the sample shape and dtype the real worker produced."""
    loader = spec.loader.model_copy(update={"sample_dtype": measured.sample_dtype})
    return spec.model_copy(update={"sample_shape": tuple(measured.sample_shape), "loader": loader})


def _read_events(read_fd: int, loader: LoaderSpec, progress: Progress | None,
                 pid: int) -> dict | None:
    """The probe's events until its result, an error, the end of the pipe or the deadline:
    ``STARTUP_SECONDS`` to import and build the Dataset, then ``--probe-seconds`` plus
    ``LATE_SECONDS`` for the measured batches. The result gets the main process's mapped
    file pages, read when its Dataset is built (``main_file_bytes``)."""
    buffer, end, file_bytes = b"", time.monotonic() + STARTUP_SECONDS, 0
    while True:
        remaining = end - time.monotonic()
        if remaining <= 0:
            raise MeasurementError(
                f"dataset {loader.dataset!r} gave no result within --probe-seconds "
                f"{loader.probe_seconds:g} (+{LATE_SECONDS} s): a __getitem__ that hangs, or "
                "one far slower than that; raise --probe-seconds if it is only slow")
        if not select.select([read_fd], [], [], min(remaining, 1.0))[0]:
            continue
        chunk = os.read(read_fd, 1 << 16)
        if not chunk:
            return None
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            event = parse_event(line.decode(errors="replace"))
            if event.get("event") == "started":
                end = time.monotonic() + loader.probe_seconds + LATE_SECONDS
                file_bytes = mapped_file_bytes(pid)
                if progress:
                    progress("memory", 0, 0)
            elif event.get("event") == "batch" and progress:
                progress("memory", event["index"] + 1, event["worker_bytes"])
            elif event.get("event") == "timing" and progress:
                progress("timing", event["batches"], 0)
            elif event.get("event") == "input_error":
                raise InputError(event["message"])
            elif event.get("event") == "error":
                raise MeasurementError(
                    f"dataset {loader.dataset!r} failed in the measuring process: "
                    f"{event['message']}; call dataset[0] in your own script to debug")
            elif event.get("event") == "result":
                return {**event, "main_file_bytes": file_bytes}


def mapped_file_bytes(pid: int) -> int:
    """PSS of the file pages a process maps (its libraries): page cache, which a memory
    cgroup charges to whoever read it first and reclaims before it OOM-kills; 0 when gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as rollup:
            for line in rollup:
                if line.startswith("Pss_File:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def start_child(module: str, config: dict, output, env: dict[str, str] | None = None,
                wrap: Callable[[list[str]], list[str]] | None = None
                ) -> tuple[subprocess.Popen, int]:
    """``python -m module CONFIG FD`` (``memcalc.host.child_events``): its stdout and stderr
    into ``output``, its events on a pipe whose read end is returned. It runs in its own
    process group with its DataLoader workers, to be killed as a group (``kill_group``); not
    its own session: with the kernel's autogroup scheduling a new session is scheduled as a
    group of its own and would get more CPU on a busy machine than the user's loader.
    ``wrap`` rewrites the command (a memory cgroup's entry)."""
    read_fd, write_fd = os.pipe()
    config = {**config, "parent_pid": os.getpid()}     # it dies with this process
    command = [sys.executable, "-m", module, json.dumps(config), str(write_fd)]
    environment = {**os.environ, **(env or {}), "PYTHONPATH": pythonpath()}
    try:
        process = subprocess.Popen(wrap(command) if wrap else command, stdin=subprocess.DEVNULL,
                                   stdout=output, stderr=output, pass_fds=(write_fd,),
                                   env=environment, cwd=os.getcwd(), **OWN_PROCESS_GROUP)
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)
    return process, read_fd


def kill_group(process: subprocess.Popen) -> None:
    """Kill the probe and every process of its group (DataLoader workers included), then
    remove the shared memory they were killed too soon to unlink (``shm_leftovers``)."""
    members = group_pids(process.pid)
    forks = _forks_of(process.pid, members)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    _wait_until_dead(members)
    _reap(forks)
    remove_torch_shm(members)


def _forks_of(pid: int, members: list[int]) -> list[int]:
    """The group's copies of process ``pid`` (forked, same command line): the probe's own
    DataLoader workers, not processes the user's code started."""
    def command(member: int) -> bytes | None:
        try:
            with open(f"/proc/{member}/cmdline", "rb") as handle:
                return handle.read()
        except OSError:
            return None
    own = command(pid)
    return [member for member in members if member != pid and own and command(member) == own]


def _reap(pids: list[int]) -> None:
    """Wait for the killed probe's workers: reparented to memcalc where it is the child
    subreaper (``memcalc.cli.leftovers``), they would wait there as zombies and be reported
    as processes the user's code left running."""
    deadline = time.monotonic() + GROUP_END_S
    for pid in pids:
        try:
            while os.waitpid(pid, os.WNOHANG) == (0, 0) and time.monotonic() < deadline:
                time.sleep(0.01)     # killed, still exiting
        except OSError:              # not this process's child (no subreaper here): init's
            continue


GROUP_END_S = 2.0
"""How long the killed group's other members (the DataLoader workers, not this process's
children) get to finish dying: a loaded run once found one still there right after."""


def _wait_until_dead(pids) -> None:
    """Wait, at most ``GROUP_END_S`` in all, until each process is gone or a zombie."""
    import psutil

    deadline = time.monotonic() + GROUP_END_S
    for pid in pids:
        while time.monotonic() < deadline:
            try:
                if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                    break
            except psutil.NoSuchProcess:
                break
            time.sleep(0.01)


def parse_event(line: str) -> dict:
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        return {}   # the user's dataset printed something


def pythonpath() -> str:
    """memcalc's own location first, so the probe imports this memcalc, then the caller's path."""
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return os.pathsep.join([package_root, os.getcwd(), os.environ.get("PYTHONPATH", "")])
