"""What the host-RAM estimate found (JSON field ``host``). Integer bytes throughout."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, computed_field

from memcalc.host.arithmetic import HostTerm
from memcalc.host.specs import HostSpec

_FROZEN = ConfigDict(frozen=True, extra="forbid")


def env_text(env: dict[str, str]) -> str:
    """Environment variables as a shell prefix: ``KEY=value KEY=value``."""
    return " ".join(f"{key}={value}" for key, value in env.items())


class WorkerMeasurement(BaseModel):
    """One real worker run by ``memcalc.host.probe`` on the user's Dataset."""

    model_config = _FROZEN

    sample_shape: tuple[int, ...]
    sample_dtype: str
    sample_bytes: int
    batch_size: int
    """The batch the worker built; other batches scale its samples and its batch bytes."""
    batch_bytes: int
    main_process_bytes: int
    """PSS of the main process with the dataset built (shared pages counted here, once)."""
    main_file_bytes: int = 0
    """Of that, mapped file pages (libraries): page cache, charged by a memory cgroup to
    whoever read it first and reclaimed before an OOM kill, so not counted in the totals."""
    dataset_bytes: int
    """What building the Dataset object added to the main process."""
    worker_first_bytes: int
    """The worker's private memory (USS without shared-memory batches) after its first batch."""
    worker_peak_bytes: int
    """Its largest private memory over the run, samples being collated included."""
    growth_bytes_per_batch: float
    """Slope of the worker's private memory over the last half of the run."""
    batches: int
    seconds_per_sample: float
    """Median wall time per sample in the timing phase, on this machine as loaded then."""
    core_seconds_per_sample: float | None = None
    """The same less the time the worker waited for a CPU (``/proc/PID/schedstat``): its time
    per sample with a core to itself, what the feeding model shares out. None where the
    kernel does not say; then the wall time stands in."""
    stopped_by: str
    """"plateau", "budget" (time) or "dataset end"."""
    receive_seconds: float | None = None
    """The main process's time to take a batch from the idle worker (``host.handover``);
    None where it was not timed (the dataset ended, or batches too slow for its budget)."""
    busy_receive_seconds: float | None = None
    """The same from the worker while it builds its next batch."""
    main_build_seconds: float | None = None
    """The probe's own process building a batch with no worker, with a core to itself (the
    0-worker prediction); None where not timed (the dataset ended, or batches too slow)."""
    fault_bytes_per_batch: float | None = None
    """Fresh memory the worker mapped per batch in the timing phase: its page faults
    (``/proc/PID/stat``) × the page size, plus the machine's huge-page faults meanwhile. About the
    batch's own bytes (written into shared memory) where the worker reuses its temporaries;
    far above where its allocator hands them back to the kernel (``host.malloc_thresholds``)."""
    malloc_env: dict[str, str]
    parent_heap: Literal["fresh", "training"] = "fresh"
    """The probe's heap when it started its worker: ``fresh`` as an interpreter starts,
    ``training`` as a training script leaves it (glibc's mmap threshold raised to its cap
    by a freed block, ``memcalc.host.probe``); forked workers inherit it."""

    @property
    def feeding_seconds_per_sample(self) -> float:
        """What the feeding model shares out: the core time where known, else the wall time."""
        return (self.core_seconds_per_sample if self.core_seconds_per_sample is not None
                else self.seconds_per_sample)


class HostFix(BaseModel):
    """A change that removes measured worker growth, measured again with the change applied."""

    model_config = _FROZEN

    cause: str
    env: dict[str, str]
    per_worker_bytes: int
    max_num_workers: int
    measurement: WorkerMeasurement


class MallocFix(BaseModel):
    """The worker measured again with glibc's malloc thresholds fixed
    (``host.malloc_thresholds``)."""

    model_config = _FROZEN

    env: dict[str, str]
    measurement: WorkerMeasurement
    """The second probe's, with ``env`` set for its whole process (the first is the host
    report's ``measurement``)."""


class VerifyReport(BaseModel):
    """The real DataLoader run at the planned worker count under the planned cap
    (``memcalc.host.verify``): its measured peak against the prediction."""

    model_config = _FROZEN

    num_workers: int
    prefetch_factor: int
    pin_memory: bool
    batches_planned: int
    """Enough for every worker to fill its prefetch queue twice."""
    batches: int
    """Batches the main process took before the run ended."""
    seconds: float
    measured_peak_bytes: int
    measured_by: str
    """"memory cgroup (v1)" / "(v2)": the kernel's charge; or "PSS + /dev/shm" sampled where
    no cgroup could be made (``cgroup_unavailable`` says why)."""
    cgroup_unavailable: str | None = None
    page_cache_bytes: int | None = None
    """Page cache of the files the run read, charged to its cgroup when it ended: part of the
    measured peak, reclaimed before an OOM kill (None without a cgroup)."""
    predicted_peak_bytes: int
    """The estimate for this run: the workers and batches as run, without the model and
    without CUDA where it was not used."""
    cap_bytes: int
    """The planned limit (usable RAM), never above the memory this machine had available."""
    held: bool
    """Every planned batch (or the dataset's end) reached within the cap, nothing OOM-killed."""
    oom_killed: bool
    reason: str | None = None
    """Why the run was cut short, when it was."""

    @computed_field
    @property
    def ratio(self) -> float:
        """Measured over predicted peak."""
        return self.measured_peak_bytes / max(1, self.predicted_peak_bytes)


class HostReport(BaseModel):
    """Host RAM of one training process and the DataLoader worker counts that fit."""

    model_config = _FROZEN

    spec: HostSpec
    measured: bool
    sample_bytes: int
    batch_bytes: int
    main_terms: list[HostTerm]
    worker_terms: list[HostTerm]
    loading_terms: list[HostTerm]
    """The main process before the loop, when the model's size is known."""
    main_process_bytes: int
    """Main process at ``num_workers`` (pinned copies grow with the worker count)."""
    per_worker_bytes: int
    """One worker at its peak, including its share of in-flight batches."""
    num_workers: int
    """The count the totals are given for: the one asked for, else the recommended one."""
    peak_bytes: int
    """The largest of ``epoch_start_bytes``, ``steady_bytes`` and ``loading_bytes``."""
    epoch_start_bytes: int
    """Every worker collating its last prefetched batch at once, the main process holding
    the first."""
    steady_bytes: int
    """Queues full, one batch in training, one worker building the next."""
    loading_bytes: int
    """Before the loop: the model and its state dict on the host (0 when not known)."""
    shm_peak_bytes: int
    limit_bytes: int
    usable_bytes: int
    fits: bool
    max_num_workers: int
    """Largest count whose peak fits the usable RAM and /dev/shm, at most the CPUs."""
    max_num_workers_steady: int
    """Largest count if workers never collate at once (e.g. desynchronised by slow I/O)."""
    limited_by: str
    recommended_num_workers: int
    recommended_pin_memory: bool
    recommended_prefetch_factor: int
    recommended_persistent_workers: bool
    sbatch: list[str]
    measurement: WorkerMeasurement | None = None
    fix: HostFix | None = None
    verify: VerifyReport | None = None
    """The plan checked on this machine (``--verify``)."""
    assumptions: list[str]
    warnings: list[str]
