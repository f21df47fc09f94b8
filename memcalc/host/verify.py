"""Check a host plan on this machine (``memcalc host --verify``): run the real DataLoader at
the planned worker count for a bounded number of batches inside a memory cgroup capped at the
planned limit, and compare its peak with the prediction.

The run is ``memcalc.host.verify_run`` in a subprocess: its own process group, killed as a
group on every exit path (done, error, time bound, Ctrl-C, SIGTERM), inside a fresh memory
cgroup (``memcalc.host.cgroup``) whose cap the kernel enforces and whose leftovers are killed
when it is removed. Where no cgroup can be made, the process tree's PSS + /dev/shm is sampled
instead and the group is killed when it passes the cap.

Known limitations: a bounded run shows what a few batches do, not growth over an epoch (a
Python-object dataset copied page by page as workers read it, a leak): the measured worker's
growth is the estimate's, the run's peak can stay below it; sampling (the fallback) can miss a peak shorter than its interval and
does not count shared-memory pages no process maps yet; the run loads no model and starts
CUDA only to pin memory, so those terms are left out of the prediction it is compared with.
"""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

import psutil

from memcalc.errors import InputError
from memcalc.host.cgroup import CgroupUnavailable, MemoryCgroup
from memcalc.host.measure import (
    LATE_SECONDS,
    STARTUP_SECONDS,
    MeasurementError,
    kill_group,
    parse_event,
    start_child,
)
from memcalc.host.procmem import host_total_bytes, shm_used_bytes
from memcalc.host.report import HostReport, VerifyReport
from memcalc.host.specs import HostSpec, LoaderSpec
from memcalc.host.workers import host_estimate
from memcalc.units import format_bytes

STEP_S = 0.05
"""The simulated training step: how long the main process holds each batch."""
POLL_S = 0.02
"""How often the run's memory is read (progress; the cap, without a cgroup)."""
Progress = Callable[[str, int, int], None]
"""Told ("verify", batches taken so far, bytes in use now)."""


def require_dataset(loader: LoaderSpec) -> None:
    """``--verify`` runs the user's Dataset: one is needed (checked before any work)."""
    if loader.dataset is None:
        raise InputError("--verify runs your real DataLoader: give --dataset "
                         "package.module:callable (a function returning your Dataset)")


def verify_batches(num_workers: int, prefetch_factor: int) -> int:
    """Batches to run: every worker fills its prefetch queue twice, plus two."""
    return max(4, num_workers * prefetch_factor * 2 + 2)


def verify_cap_bytes(usable_bytes: int, available_bytes: int | None = None) -> int:
    """The planned limit, never more than this machine can spare now."""
    available = psutil.virtual_memory().available if available_bytes is None else available_bytes
    return min(usable_bytes, available)


def run_spec(spec: HostSpec, pin_memory: bool) -> HostSpec:
    """The spec as the verify run runs it: no model, no step on the CPU, CUDA only where the
    batches are pinned here."""
    loader = spec.loader.model_copy(update={"pin_memory": pin_memory})
    return spec.model_copy(update={"cuda": pin_memory, "model_bytes": 0, "cpu_step_bytes": 0,
                                   "offloaded_activation_bytes": 0, "loader": loader})


def with_verify(host: HostReport, progress: Progress | None = None) -> HostReport:
    """The report with its plan checked on this machine (``HostReport.verify``)."""
    return host.model_copy(update={"verify": verify_plan(host, progress=progress)})


def verify_plan(host: HostReport, cap_bytes: int | None = None, seconds: float | None = None,
                progress: Progress | None = None) -> VerifyReport:
    """Run the real DataLoader at ``host.num_workers`` under the cap; measured vs predicted."""
    spec, count = host.spec, host.num_workers
    loader = spec.loader
    require_dataset(loader)
    pin = spec.pin_memory and _cuda_available()
    predicted = host_estimate(run_spec(spec.model_copy(update={"loader": loader.model_copy(
        update={"num_workers": count})}), pin), host.measurement).peak_bytes
    cap = cap_bytes if cap_bytes is not None else verify_cap_bytes(host.usable_bytes)
    config = {"dataset": loader.dataset, "batch_size": spec.batch_size, "num_workers": count,
              "prefetch_factor": loader.prefetch_factor, "pin_memory": pin,
              "start_method": loader.start_method.value,
              "persistent_workers": loader.persistent_workers,
              "batches": verify_batches(count, loader.prefetch_factor), "step_s": STEP_S,
              "seconds": seconds or loader.probe_seconds}
    try:
        group, unavailable = MemoryCgroup(limit_bytes=cap), None
    except CgroupUnavailable as error:
        group, unavailable = None, str(error)
    with group or contextlib.nullcontext():
        run = _run(config, group, cap, progress)
        peak = group.peak_bytes() if group else run.sampled_peak
        oom = bool(group and group.oom_kills())
        cache = group.file_cache_bytes() if group else None
    reason = _reason(run, oom, config, cap)
    enough = count * loader.prefetch_factor + 1
    return VerifyReport(
        num_workers=count, prefetch_factor=loader.prefetch_factor, pin_memory=pin,
        batches_planned=config["batches"], batches=run.batches, seconds=round(run.seconds, 2),
        measured_peak_bytes=peak,
        measured_by=group.description if group else "PSS + /dev/shm (sampled)",
        cgroup_unavailable=unavailable, page_cache_bytes=cache,
        predicted_peak_bytes=predicted, cap_bytes=cap,
        held=not oom and not run.over_cap and run.result is not None
        and (run.batches >= enough or run.result["stopped_by"] != "time"),
        oom_killed=oom, reason=reason)


@dataclass
class _Outcome:
    result: dict | None = None
    error: str | None = None
    batches: int = 0
    seconds: float = 0.0
    sampled_peak: int = 0
    over_cap: bool = False
    timed_out: bool = False
    stderr: str = ""
    returncode: int | None = None


def _run(config: dict, group: MemoryCgroup | None, cap: int,
         progress: Progress | None) -> _Outcome:
    """Start the runner (inside ``group`` when there is one) and follow it to its end."""
    outcome, start = _Outcome(), time.monotonic()
    shm_baseline = shm_used_bytes()
    with tempfile.TemporaryFile() as output:
        process, read_fd = start_child("memcalc.host.verify_run", config, output,
                                       wrap=group.wrap if group is not None else None)
        try:
            _follow(read_fd, process, config, outcome, group=group, cap=cap,
                    shm_baseline=shm_baseline, progress=progress)
        finally:
            os.close(read_fd)
            kill_group(process)
        outcome.seconds = time.monotonic() - start
        outcome.returncode = process.returncode
        output.seek(0)
        outcome.stderr = output.read().decode(errors="replace")
    return outcome


def _follow(read_fd: int, process: subprocess.Popen, config: dict, outcome: _Outcome, *,
            group: MemoryCgroup | None, cap: int, shm_baseline: int,
            progress: Progress | None) -> None:
    """Read the runner's events until its result, an error, its end, the time bound or (no
    cgroup) the sampled total passing the cap."""
    buffer, end = b"", time.monotonic() + STARTUP_SECONDS
    while True:
        now = group.usage_bytes() if group else host_total_bytes(process.pid, shm_baseline)
        outcome.sampled_peak = max(outcome.sampled_peak, now)
        if group is None and now > cap:
            outcome.over_cap = True
            return
        if time.monotonic() > end:
            outcome.timed_out = True
            return
        if not select.select([read_fd], [], [], POLL_S)[0]:
            continue
        chunk = os.read(read_fd, 1 << 16)
        if not chunk:
            return
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            event = parse_event(line.decode(errors="replace"))
            kind = event.get("event")
            if kind == "started":
                end = time.monotonic() + config["seconds"] + LATE_SECONDS
            elif kind == "batch":
                outcome.batches = event["index"] + 1
                if progress:
                    progress("verify", outcome.batches, now)
            elif kind == "input_error":
                raise InputError(event["message"])
            elif kind == "error":
                outcome.error = event["message"]
                return
            elif kind == "result":
                outcome.result = event
                return


def _reason(run: _Outcome, oom: bool, config: dict, cap: int) -> str | None:
    """Why the run was cut short (None: it ran its batches); a failure of the user's Dataset
    that was not the cap is raised, one line."""
    if oom:
        return f"OOM-killed at the {format_bytes(cap)} cap after {run.batches} batches"
    if run.over_cap:
        return (f"PSS + /dev/shm passed the {format_bytes(cap)} cap after {run.batches} "
                "batches: killed")
    if run.error is not None:
        raise MeasurementError(f"dataset {config['dataset']!r} failed in the verify run: "
                               f"{run.error}; call dataset[0] in your own script to debug")
    if run.timed_out:
        return (f"cut by the time bound ({config['seconds']:g} s, --probe-seconds) after "
                f"{run.batches} batches")
    if run.result is None:
        last = run.stderr.strip().splitlines()[-1] if run.stderr.strip() else \
            f"exit {run.returncode}"
        raise MeasurementError(f"the verify run of {config['dataset']!r} stopped: {last}")
    if run.result["stopped_by"] == "time":
        return (f"time bound ({config['seconds']:g} s, --probe-seconds) reached after "
                f"{run.batches} of {config['batches']} batches")
    if run.result["stopped_by"] == "dataset end":
        return f"the dataset ended after {run.batches} batches"
    return None


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()
