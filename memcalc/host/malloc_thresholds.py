"""Workers that hand their large temporaries back to the kernel after each sample and fault
them in again for the next: glibc's malloc thresholds as a worker's speed.

glibc serves a request above its mmap threshold (128 KiB at start) with a fresh mapping and
unmaps it on free(); freeing such a mapping raises the threshold to its size (up to 32 MiB),
so later requests of that size come from the heap, whose top goes back to the kernel above
the trim threshold (twice the mmap threshold). Which of these a worker's temporaries meet
depends on what the training process allocated before it started its workers, which the
workers inherit: measured here (``benchmarks/results-malloc.md``), 3D volumes (6 MiB
float32 temporaries) cost a worker 30-52 ms a batch by that history alone, slice stacks
21-28 ms (19 with both thresholds set). The fresh pages show in the worker's page faults
(``WorkerMeasurement.fault_bytes_per_batch``): near the batch it writes into shared memory
where it reuses its temporaries, far above where it maps them afresh.

Where they are far above, the probe runs again with both thresholds fixed above the worker's
peak (``reuse_env``): temporaries then stay in the heap and are reused, at the same peak.
Fixing the trim threshold alone also stops the mmap threshold rising from 128 KiB, so every
large temporary is mapped afresh (slice stacks: 95 ms a batch): both or neither.
"""

from __future__ import annotations

import platform

from memcalc.host.measure import Progress, measure_worker
from memcalc.host.report import MallocFix, WorkerMeasurement, env_text
from memcalc.host.specs import LoaderSpec
from memcalc.units import format_bytes

CHURN_FACTOR = 1.25
CHURN_FLOOR_BYTES = 1 << 20
"""Fresh memory per batch beyond CHURN_FACTOR × the batch's bytes + this counts as a worker
mapping its temporaries afresh (reusing them it maps the batch's shared memory and little
else: 1.04-1.09 × with both thresholds set on the kinds of ``benchmarks/results-malloc.md``)."""
MIN_THRESHOLD_BYTES = 64 << 20
THRESHOLD_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")
MIN_GAIN = 0.10
"""A worker this much faster with the thresholds fixed is worth the advice..."""
PEAK_SLACK, PEAK_FLOOR_BYTES = 1.25, 16 << 20
"""...unless its peak rose beyond this share of the measured one plus this (and one sample's
temporaries, which the heap now keeps by design): temporaries kept in the heap can fragment
it (a torch temporary allocated after the sample it fed grew a
worker from 54 to 454 MiB)."""


def churns(measured: WorkerMeasurement) -> bool:
    """Whether the worker mapped far more fresh memory per batch than the batch it built,
    on glibc, with neither threshold already set for the probe."""
    faults = measured.fault_bytes_per_batch
    return (faults is not None and platform.libc_ver()[0] == "glibc"
            and not any(key in measured.malloc_env for key in THRESHOLD_ENV)
            and faults > CHURN_FACTOR * measured.batch_bytes + CHURN_FLOOR_BYTES)


def reuse_env(worker_peak_bytes: int) -> dict[str, str]:
    """Both thresholds at the power of two at or above the worker's peak private memory
    (at least MIN_THRESHOLD_BYTES): no temporary it frees is larger, and the heap it keeps
    is no larger than the peak it already reaches."""
    threshold = max(MIN_THRESHOLD_BYTES, 1 << max(0, worker_peak_bytes - 1).bit_length())
    return {key: str(threshold) for key in THRESHOLD_ENV}


def malloc_fix(loader: LoaderSpec, measured: WorkerMeasurement,
               progress: Progress | None = None) -> MallocFix | None:
    """The worker measured again with ``reuse_env`` where it churns; None otherwise."""
    if not churns(measured):
        return None
    env = reuse_env(measured.worker_peak_bytes)
    again = measure_worker(loader, measured.batch_size, env=env, progress=progress)
    return MallocFix(env=env, measurement=again)


def declined(fix: MallocFix, measured: WorkerMeasurement,
             against: WorkerMeasurement | None = None) -> str | None:
    """Why the fixed thresholds are not advised (the assumption line), or None where they
    made the worker at least MIN_GAIN faster than ``against`` (the forecast's own
    measurement; ``measured``, the churning one, by default) without raising its peak
    beyond PEAK_SLACK."""
    env = " and ".join(fix.env)
    again, against = fix.measurement, against or measured
    times = (f"with {env} fixed it built a sample in "
             f"{again.feeding_seconds_per_sample * 1e3:.3g} ms against "
             f"{against.feeding_seconds_per_sample * 1e3:.3g} ms")
    fresh = (f"the worker mapped {format_bytes(int(measured.fault_bytes_per_batch))} afresh per "
             f"batch of {measured.batch_size}; ")
    if again.feeding_seconds_per_sample > (1 - MIN_GAIN) * against.feeding_seconds_per_sample:
        return f"{fresh}{times}, no faster"
    # the heap now keeps one sample's temporary instead of handing it back: that much is the
    # expected price, not fragmentation (the measured peak may or may not have caught it)
    kept = (measured.fault_bytes_per_batch or 0) / max(measured.batch_size, 1)
    if again.worker_peak_bytes > (PEAK_SLACK * measured.worker_peak_bytes + PEAK_FLOOR_BYTES
                                  + kept):
        return (f"{fresh}{times}, but its peak rose from "
                f"{format_bytes(measured.worker_peak_bytes)} to "
                f"{format_bytes(again.worker_peak_bytes)} (its heap fragments): not advised")
    return None


def malloc_advice(fix: MallocFix, measured: WorkerMeasurement, workers: int,
                  as_is: float, fixed: float, against: WorkerMeasurement | None = None) -> str:
    """The advice line: the env to set, and what it changed against the forecast's worker
    (``against``; ``measured`` by default) and in the GPU-busy share at ``workers``
    (``as_is`` without it, ``fixed`` with it)."""
    against = against or measured
    return (f"the workers map {format_bytes(int(measured.fault_bytes_per_batch))} afresh per "
            f"batch of {measured.batch_size} ({format_bytes(measured.batch_bytes)} of batch): "
            "glibc hands their temporaries back to the kernel, and what that costs depends on "
            "what the training process allocated before starting them. With "
            f"`{env_text(fix.env)}` in the job's environment a worker built a sample in "
            f"{fix.measurement.feeding_seconds_per_sample * 1e3:.3g} ms against "
            f"{against.feeding_seconds_per_sample * 1e3:.3g} ms (peak "
            f"{format_bytes(fix.measurement.worker_peak_bytes)} against "
            f"{format_bytes(measured.worker_peak_bytes)}): GPU busy {fixed:.0%} instead of "
            f"{as_is:.0%} at {workers} workers. Set both: the trim threshold alone pins the "
            "mmap threshold at 128 KiB and maps every large temporary afresh")


def churn_warning(measured: WorkerMeasurement) -> str | None:
    """For a check against real loaders: their workers' time depends on the process's
    allocations before it started them, unlike the probe's one draw; None where it does not
    churn."""
    if not churns(measured):
        return None
    env = env_text(reuse_env(measured.worker_peak_bytes))
    return (f"the worker maps {format_bytes(int(measured.fault_bytes_per_batch))} of fresh "
            f"memory per batch of {measured.batch_size} ({format_bytes(measured.batch_bytes)}): "
            "its time per batch depends on what this process allocated before starting it "
            "(up to 45 % more for the same code), so rows can disagree with the prediction by "
            f"that alone; run the check with `{env}` set for a repeatable one, and train with "
            "it")
