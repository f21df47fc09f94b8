"""Host RAM of the training process and the DataLoader worker counts that fit the machine."""

from __future__ import annotations

import math
import os
import platform
from dataclasses import dataclass

from memcalc.errors import InputError
from memcalc.host.arithmetic import (
    COLLATING,
    TORCH_PROCESS_BYTES,
    HostTerm,
    batch_bytes,
    in_flight_term,
    pinned_block_bytes,
    loading_terms,
    main_terms,
    sample_bytes,
    worker_terms,
)
from memcalc.host.report import HostReport, WorkerMeasurement
from memcalc.host.specs import HostSpec, StartMethod
from memcalc.units import format_bytes

MMAP_THRESHOLD_MAX_BYTES = 32 << 20
"""glibc's dynamic mmap threshold never rises above this on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX)."""
MMAP_THRESHOLD_MIN_BYTES = 128 << 10
MALLOC_FIX_ENV = {"MALLOC_MMAP_THRESHOLD_": str(1 << 20)}
_MIB = 1 << 20


@dataclass(frozen=True)
class WorkerCapacity:
    """What RAM and CPUs allow, before anyone asks how many workers the GPU needs."""

    max_num_workers: int
    batch_bytes: int


def worker_capacity(spec: HostSpec, measurement: WorkerMeasurement | None = None
                    ) -> WorkerCapacity:
    """The most workers that fit and the bytes of one batch (``host_estimate``'s own figures)."""
    sizes = _Sizes(spec, measurement)
    return WorkerCapacity(_largest(sizes.fits, spec.machine.cpus), sizes.batch)


def host_estimate(spec: HostSpec, measurement: WorkerMeasurement | None = None) -> HostReport:
    """Worst-case host RAM per worker count; the largest and the recommended count."""
    loader, machine = spec.loader, spec.machine
    sizes = _Sizes(spec, measurement)
    max_workers = _largest(sizes.fits, machine.cpus)
    recommended = min(max_workers, max(1, machine.cpus - 1) if spec.workers_needed is None
                      else spec.workers_needed)
    count = loader.num_workers if loader.num_workers is not None else recommended
    pinned = _Sizes(spec.model_copy(update=dict(loader=loader.model_copy(
        update=dict(pin_memory=True)))), measurement)
    return HostReport(
        spec=spec, measured=measurement is not None, sample_bytes=sizes.sample,
        batch_bytes=sizes.batch, main_terms=sizes.main_at(count), worker_terms=sizes.workers,
        loading_terms=sizes.loading_terms if sizes.loading else [],
        main_process_bytes=_sum(sizes.main_at(count)), per_worker_bytes=sizes.per_worker,
        num_workers=count, peak_bytes=sizes.total_at(count), shm_peak_bytes=sizes.shm_at(count),
        limit_bytes=machine.limit_bytes, usable_bytes=sizes.usable, fits=sizes.fits(count),
        epoch_start_bytes=sizes.epoch_start_at(count), steady_bytes=sizes.steady_at(count),
        loading_bytes=sizes.loading,
        max_num_workers=max_workers,
        max_num_workers_steady=_largest(sizes.fits_steady, machine.cpus),
        limited_by=_limited_by(max_workers, machine.cpus, sizes),
        recommended_num_workers=recommended,
        recommended_pin_memory=spec.cuda and pinned.fits(recommended),
        recommended_prefetch_factor=loader.prefetch_factor,
        recommended_persistent_workers=not loader.dataset_python_objects,
        sbatch=_sbatch(recommended, sizes.total_at(recommended), loader.headroom_fraction,
                       machine.mem_per_cpu_bytes),
        measurement=measurement,
        assumptions=_assumptions(spec, measurement, sizes.batch),
        warnings=_warnings(spec, sizes.sample, measurement)
        + ([_loading_advice(machine.node_processes)]
           if sizes.loading > max(sizes.epoch_start_at(count), sizes.steady_at(count)) else []),
    )


def _loading_advice(processes: int) -> str:
    """What lowers a loading peak; with ``processes`` per node, each of them loads at once."""
    advice = ("loading the model is the host peak: torch.load(..., mmap=True) with "
              "load_state_dict(..., assign=True) avoids holding a second copy")
    if processes == 1:
        return advice
    return (f"{advice}; all {processes} processes on the node load it at once: build it on "
            "the meta device and load each rank's shard (torch.distributed.checkpoint), or "
            "load it in rank 0 only and broadcast it (FSDP's sync_module_states, Accelerate's "
            "cpu_ram_efficient_loading)")


class _Sizes:
    """Totals as a function of the worker count, from the arithmetic or a measured worker."""

    def __init__(self, spec: HostSpec, measurement: WorkerMeasurement | None) -> None:
        self.spec, loader, self.measured = spec, spec.loader, measurement is not None
        if measurement is not None:
            self.sample = measurement.sample_bytes
            self.batch = measurement.batch_bytes * spec.batch_size // measurement.batch_size
            self.dataset = measurement.dataset_bytes
            self.baseline = (measurement.main_process_bytes - self.dataset
                             - measurement.main_file_bytes)
            self.workers = _measured_worker_terms(spec, measurement, self.batch)
        elif spec.sample_shape is None:
            raise InputError("the host estimate needs --shape, or --dataset to measure")
        else:
            self.sample, self.batch = sample_bytes(spec), batch_bytes(spec)
            self.dataset, self.baseline = loader.dataset_bytes, TORCH_PROCESS_BYTES
            self.workers = worker_terms(spec, self.batch, self.dataset)
        self.per_worker = _sum(self.workers)
        self.loading_terms = loading_terms(spec, self.baseline, self.dataset)
        self.loading = _sum(self.loading_terms) if spec.model_bytes else 0
        self.transient = self.workers[-2].total_bytes   # samples being collated
        self.usable = int(spec.machine.limit_bytes * (1 - loader.headroom_fraction))

    def main_at(self, count: int) -> list[HostTerm]:
        return main_terms(self.spec, self.batch, count, self.baseline, self.dataset,
                          measured=self.measured)

    def total_at(self, count: int) -> int:
        """The largest of the moments a worker count peaks at (see ``epoch_start_at``)."""
        return max(self.epoch_start_at(count), self.steady_at(count), self.loading)

    def epoch_start_at(self, count: int) -> int:
        """All workers collating their last prefetched batch together while the main process
        holds the first one: taking it sent its worker a new index, so ``prefetch_factor`` ×
        workers batches are in flight beside the held one (as ``shm_at`` counts them). A
        memory cgroup saw this in a real DataLoader: 738 MiB at 2 workers of 40 MiB samples,
        batch 2, where this moment less the held batch is 662 MiB."""
        return _sum(self.main_at(count)) + count * self.per_worker

    def steady_at(self, count: int) -> int:
        """Queues full, the main process training on a batch, one worker building the next."""
        building = self.transient if count else 0
        return _sum(self.main_at(count)) + count * (self.per_worker - self.transient) + building

    def shm_at(self, count: int) -> int:
        """/dev/shm in use: every in-flight batch, or only those not yet pinned."""
        if not count:
            return 0
        in_shm = count + 1 if self.spec.pin_memory else count * self.spec.loader.prefetch_factor + 1
        return in_shm * self.batch

    def fits(self, count: int) -> bool:
        return self.total_at(count) <= self.usable and self.shm_fits(count)

    def fits_steady(self, count: int) -> bool:
        return self.steady_at(count) <= self.usable and self.shm_fits(count)

    def shm_fits(self, count: int) -> bool:
        shm = self.spec.machine.shm_bytes
        return shm is None or self.shm_at(count) <= shm


def _measured_worker_terms(spec: HostSpec, measured: WorkerMeasurement, batch: int
                           ) -> list[HostTerm]:
    """The measured worker split into what stays (its pages, retained heap, dataset copies)
    and the samples it collates, which scale with the batch size."""
    collated = measured.batch_size * measured.sample_bytes
    return [
        HostTerm(name="worker process (measured)",
                 bytes_each=max(0, measured.worker_peak_bytes - collated), count=1,
                 per_worker=True,
                 note=f"real worker's peak over {measured.batches} batches minus the samples "
                      "it was collating"),
        HostTerm(name=COLLATING, bytes_each=spec.batch_size * measured.sample_bytes,
                 count=1, per_worker=True,
                 note=f"{spec.batch_size} measured samples"),
        in_flight_term(spec, batch),
    ]


def idle_workers_bytes(host: HostReport) -> int:
    """What the loader's workers keep between epochs when they persist: each worker's own
    terms without the samples it collates and the batches it has in flight."""
    if not host.spec.loader.persistent_workers:
        return 0
    kept = [term for term in host.worker_terms if term.name != COLLATING
            and term.name != in_flight_term(host.spec, host.batch_bytes).name]
    return host.num_workers * _sum(kept)


def _sum(terms: list[HostTerm]) -> int:
    return sum(term.total_bytes for term in terms)


def _largest(fits, most: int) -> int:
    """The largest count in 0..most that fits (totals grow with the count)."""
    best = 0
    for count in range(most + 1):
        if not fits(count):
            break
        best = count
    return best


def _limited_by(max_workers: int, cpus: int, sizes: _Sizes) -> str:
    if max_workers == cpus:
        return f"CPUs ({cpus})"
    if sizes.loading > sizes.usable:
        each = (f" in each of {sizes.spec.machine.node_processes} processes' share"
                if sizes.spec.machine.node_processes > 1 else "")
        return f"RAM: loading the model (module + state dict) does not fit{each}"
    if not sizes.fits(0):
        return "RAM: the main process alone does not fit"
    if sizes.total_at(max_workers + 1) <= sizes.usable:
        return "/dev/shm size"
    return "RAM"


def _sbatch(workers: int, peak: int, headroom: float, mem_per_cpu: int | None) -> list[str]:
    """A SLURM request for one training process: a CPU per worker plus the main process. With
    the allocation's ``--mem-per-cpu`` given, that is kept and CPUs are added until their
    memory holds the peak (SLURM grants memory per CPU)."""
    need = peak / (1 - headroom)
    if mem_per_cpu is None:
        cpus_per_task = workers + 1
        mem_per_cpu_mib = math.ceil(need / cpus_per_task / _MIB)
    else:
        cpus_per_task = max(workers + 1, math.ceil(need / mem_per_cpu))
        mem_per_cpu_mib = mem_per_cpu // _MIB
    return [f"#SBATCH --cpus-per-task={cpus_per_task}", f"#SBATCH --mem-per-cpu={mem_per_cpu_mib}M"]


def _assumptions(spec: HostSpec, measurement: WorkerMeasurement | None,
                 batch: int) -> list[str]:
    loader, machine = spec.loader, spec.machine
    notes = [
        "peak = the larger of two moments: epoch start (every worker collating its last "
        "prefetched batch at once while the main process trains on the first) and steady "
        "state (all queues full, the main process training on one batch, one worker "
        "building the next); bytes as a memory cgroup charges them (anonymous and shared "
        "memory; page cache of libraries and files is reclaimable and left out)",
        f"machine: {machine.cpus} CPUs, limit {format_bytes(machine.limit_bytes)} ({machine.source})"
        f", {format_bytes(loader.headroom_fraction * machine.limit_bytes)} kept free "
        f"({loader.headroom_fraction:.0%} headroom)",
        f"workers started with {loader.start_method.value}",
        "recommended: the workers the feeding model says keep the GPU ≥ 95 % busy"
        if spec.workers_needed is not None else "recommended ≤ CPUs − 1 (one CPU for the main "
        "process); give a GPU and a sample time (--dataset or --sample-time) to size it to the "
        "step",
    ]
    if machine.node_processes > 1:
        notes.append(f"one of {machine.node_processes} training processes on the node (one "
                     "per GPU), each with its own DataLoader workers: its CPUs, RAM and "
                     f"/dev/shm are 1/{machine.node_processes} of the node's, every process "
                     "at its peak at once (they load and start their epochs together)")
    if machine.shm_bytes is None:
        notes.append("/dev/shm size not known: not checked (Linux's default tmpfs is half of "
                     "RAM, Docker's 64 MiB; give --shm)")
    elif machine.shm_assumed:
        notes.append(f"/dev/shm assumed {format_bytes(machine.shm_bytes)}: Linux's default "
                     "tmpfs, half of RAM (Docker's is 64 MiB, SLURM sites may set their own; "
                     "give --shm)")
    if measurement is None:
        notes.append(f"python + torch {format_bytes(TORCH_PROCESS_BYTES)} and worker baselines "
                     "measured with torch 2.13 on Linux in a memory cgroup; other imports of "
                     "your script add to them")
        notes.append(f"sample {loader.sample_dtype or 'float32'}; building one holds the sample"
                     + (f", a {loader.raw_dtype} decoded copy" if loader.raw_dtype else "")
                     + f" and {loader.transform_copies} full-size transform copies "
                     "(--raw-dtype, --transform-copies)")
    if spec.pin_memory:
        example = f": a {format_bytes(batch)} batch pins {format_bytes(pinned_block_bytes(batch))}"
        notes.append("pin_memory: pinned copies of in-flight batches, kept by the CUDA caching "
                     "host allocator in blocks rounded up to powers of two (PowerOf2Ceil in "
                     f"ATen/core/CachingHostAllocator.h){example}; modelled, not measured "
                     "without CUDA")
    return notes


def _warnings(spec: HostSpec, sample: int, measurement: WorkerMeasurement | None) -> list[str]:
    warnings = []
    machine = spec.machine
    if machine.detected:
        workers = spec.loader.num_workers
        if workers is not None and workers > machine.cpus:
            warnings.append(f"num_workers {workers} is more than this machine's {machine.cpus} "
                            "CPUs: planned as asked, for a training node that has them")
        warnings.append(
            f"the host plan is for this machine ({machine.described()}), often a login node, not "
            "the training node: give the training node's --cpus, --ram and --shm (or "
            "--mem-per-cpu, as in its SLURM allocation)")
    at_risk = MMAP_THRESHOLD_MIN_BYTES < sample <= MMAP_THRESHOLD_MAX_BYTES
    if (measurement is None and at_risk and platform.libc_ver()[0] == "glibc"
            and "MALLOC_MMAP_THRESHOLD_" not in os.environ):
        warnings.append(
            f"samples of {format_bytes(sample)} are below glibc's 32 MiB dynamic mmap "
            "threshold: freed sample buffers can stay in the workers' heaps, growing each "
            "worker well beyond this arithmetic; measure with --dataset, or launch with "
            "MALLOC_MMAP_THRESHOLD_=1048576")
    if spec.loader.dataset_python_objects and spec.loader.start_method is StartMethod.FORK:
        warnings.append("forked workers copy a Python-object dataset page by page as they read "
                        "it (reference counts): store it as numpy arrays or tensors to share it")
    return warnings
