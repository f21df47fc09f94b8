"""Host RAM of one training process from the sample shape: the terms and their arithmetic.

Each term is a peak: a worker is counted while it collates a batch (its samples and the
collated copy alive), the main process while it holds the batch it trains on. How the
terms add up over time (epoch start vs steady state) is ``memcalc.host.workers``'s concern.
Bytes are counted as a memory cgroup charges them (what a SLURM job's limit enforces):
anonymous memory and shared memory; the page cache of mapped libraries is charged to whoever
read it first and reclaimed before an OOM kill, so it is left out. Baseline constants were
measured on Linux x86-64, Python 3.11, torch 2.13 (CPU wheel), glibc 2.36, in a fresh memory
cgroup (``memcalc.host.cgroup``) and with ``memcalc.host.procmem``.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, computed_field

from memcalc.dtypes import dtype_bytes
from memcalc.host.specs import HostSpec, StartMethod

TORCH_PROCESS_BYTES = 150 << 20
"""``python -c 'import torch'`` as a fresh memory cgroup charges it (``memory.max_usage_in_bytes``
150 MiB; its ``Anonymous`` 149 MiB). Its PSS is 184-218 MiB: 36-75 MiB of mapped libraries,
page cache that depends on how many processes share it and is not charged again here."""
FORK_WORKER_BYTES = 16 << 20
"""Pages a forked worker dirties (copy-on-write) running the DataLoader worker loop."""
SPAWN_WORKER_BYTES = 155 << 20
"""A spawned/forkserver worker re-imports torch: its anonymous memory (libraries shared)."""
CUDA_HOST_CONTEXT_BYTES = 1_500_000_000
"""Host RSS added by initialising CUDA in the main process (PyTorch issue #113326)."""

HELD_BATCH = "batch being trained on"
COLLATING = "samples being collated"
"""A worker's term for the samples of the batch it builds (gone between epochs)."""

class HostTerm(BaseModel):
    """One line of the arithmetic: ``count × bytes_each``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    bytes_each: int
    count: int
    per_worker: bool
    """Part of a worker's cost (repeated for every worker) rather than the main process's."""
    note: str

    @computed_field
    @property
    def total_bytes(self) -> int:
        return self.bytes_each * self.count


def pinned_block_bytes(nbytes: int) -> int:
    """The CUDA caching host allocator rounds every pinned request up to a power of two
    before ``cudaHostAlloc`` and caches the block (``allocate()`` in
    ``aten/src/ATen/core/CachingHostAllocator.h``: ``roundSize = c10::llvm::PowerOf2Ceil(size)``)."""
    return 1 << max(0, math.ceil(math.log2(max(nbytes, 1))))


def sample_bytes(spec: HostSpec) -> int:
    return math.prod(spec.sample_shape) * dtype_bytes(spec.loader.sample_dtype or "float32")


def batch_bytes(spec: HostSpec) -> int:
    return spec.batch_size * sample_bytes(spec)


def build_peak_bytes(spec: HostSpec, sample: int) -> int:
    """Bytes alive while one sample is built: decoded raw copy + intermediates + the sample."""
    raw = (math.prod(spec.sample_shape) * dtype_bytes(spec.loader.raw_dtype)
           if spec.loader.raw_dtype else 0)
    return raw + sample * (1 + spec.loader.transform_copies)


def main_terms(spec: HostSpec, batch: int, num_workers: int, torch_process_bytes: int,
               dataset_bytes: int, measured: bool = False) -> list[HostTerm]:
    """The main (training) process: interpreter, CUDA, dataset, the batch it is consuming."""
    terms = [HostTerm(name="python + torch", bytes_each=torch_process_bytes, count=1,
                      per_worker=False, note="measured main process with your imports (PSS less "
                      "mapped libraries)" if measured else "interpreter with torch imported "
                      "(as a memory cgroup charges it)")]
    if spec.cuda:
        terms.append(HostTerm(name="CUDA host context", bytes_each=CUDA_HOST_CONTEXT_BYTES, count=1,
                              per_worker=False, note="initialising CUDA (PyTorch #113326)"))
    if spec.cpu_step_bytes and not spec.cuda:
        terms.append(HostTerm(name="training step on the CPU", bytes_each=spec.cpu_step_bytes,
                              count=1, per_worker=False,
                              note="model states, activations: the traced step's peak"))
    if dataset_bytes:
        terms.append(HostTerm(name="dataset object", bytes_each=dataset_bytes, count=1,
                              per_worker=False, note="in-memory dataset in the main process"))
    if spec.offloaded_activation_bytes and spec.cuda:
        terms.append(HostTerm(name="offloaded activations", count=1, per_worker=False,
                              bytes_each=spec.offloaded_activation_bytes,
                              note="pinned copies of saved tensors (save_on_cpu)"))
    if spec.offloaded_state_bytes:
        terms.append(HostTerm(name="offloaded model states", count=1, per_worker=False,
                              bytes_each=spec.offloaded_state_bytes,
                              note="FSDP2 CPU offload: parameter and gradient shards, "
                                   "optimizer state and step (traced)"))
    if spec.host_tensor_bytes:
        terms.append(HostTerm(name="step's tensors on the CPU", count=1, per_worker=False,
                              bytes_each=spec.host_tensor_bytes,
                              note="sliding-window output and windows in host RAM (traced)"))
    if spec.resident_worker_bytes:
        terms.append(HostTerm(name="training loader's workers", count=1, per_worker=False,
                              bytes_each=spec.resident_worker_bytes,
                              note="persistent workers, idle while validation runs"))
    held = pinned_block_bytes(batch) if spec.pin_memory else batch
    terms.append(HostTerm(name=HELD_BATCH, bytes_each=held, count=1,
                          per_worker=False, note="held until the next batch replaces it"
                          + ("; pinned block" if spec.pin_memory else "")))
    if num_workers == 0:
        sample = sample_bytes(spec)
        terms.append(HostTerm(
            name="batch being built (no workers)",
            bytes_each=batch + (spec.batch_size - 1) * sample + build_peak_bytes(spec, sample),
            count=1, per_worker=False, note="samples of the next batch + its collated copy"))
    elif spec.pin_memory:
        terms.append(HostTerm(name="batch being pinned", bytes_each=batch, count=1,
                              per_worker=False,
                              note="shared-memory copy alive while the pin thread copies it"))
    return terms


def loading_terms(spec: HostSpec, torch_process_bytes: int, dataset_bytes: int
                  ) -> list[HostTerm]:
    """Before the loop: the model built on the host and the checkpoint's state dict."""
    terms = [HostTerm(name="python + torch", bytes_each=torch_process_bytes, count=1,
                      per_worker=False, note="interpreter with torch imported"),
             HostTerm(name="model while loading", bytes_each=spec.model_bytes, count=2,
                      per_worker=False, note="the module and the loaded state dict, before "
                      + ("moving to the GPU" if spec.cuda else "training"))]
    if spec.cuda:
        terms.append(HostTerm(name="CUDA host context", bytes_each=CUDA_HOST_CONTEXT_BYTES,
                              count=1, per_worker=False, note="initialising CUDA"))
    if dataset_bytes:
        terms.append(HostTerm(name="dataset object", bytes_each=dataset_bytes, count=1,
                              per_worker=False, note="in-memory dataset in the main process"))
    return terms


def worker_terms(spec: HostSpec, batch: int, dataset_bytes: int) -> list[HostTerm]:
    """One worker at its peak: baseline, dataset copy, samples being collated, its batches."""
    loader, sample = spec.loader, sample_bytes(spec)
    forked = loader.start_method is StartMethod.FORK
    terms = [HostTerm(name="worker process", bytes_each=FORK_WORKER_BYTES if forked
                      else SPAWN_WORKER_BYTES, count=1, per_worker=True,
                      note="copy-on-write pages of a forked worker" if forked
                      else f"{loader.start_method.value}: re-imports torch")]
    if dataset_bytes and (loader.dataset_python_objects or not forked):
        terms.append(HostTerm(
            name="dataset copy", bytes_each=dataset_bytes, count=1, per_worker=True,
            note="Python objects copied on read (refcounts)" if forked
            else "dataset pickled into every worker"))
    terms.append(HostTerm(
        name=COLLATING,
        bytes_each=(spec.batch_size - 1) * sample + build_peak_bytes(spec, sample),
        count=1, per_worker=True, note=f"{spec.batch_size} samples; decode/transform copies"))
    terms.append(in_flight_term(spec, batch))
    return terms


def in_flight_term(spec: HostSpec, batch: int) -> HostTerm:
    """A worker's prefetched batches: in /dev/shm, or in pinned blocks once the pin thread
    has copied them (the shared-memory copy is then freed)."""
    if spec.pin_memory:
        return HostTerm(name="batches in flight (pinned)", bytes_each=pinned_block_bytes(batch),
                        count=spec.loader.prefetch_factor, per_worker=True,
                        note="prefetch_factor batches per worker, power-of-two pinned blocks")
    return HostTerm(name="batches in shared memory", bytes_each=batch,
                    count=spec.loader.prefetch_factor, per_worker=True,
                    note="prefetch_factor batches per worker (/dev/shm)")
