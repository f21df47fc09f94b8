"""What the data pipeline and the machine look like: the inputs of the host-RAM estimate."""

from __future__ import annotations

from enum import Enum

from pydantic import BaseModel, ConfigDict, Field, model_validator

from memcalc.units import format_bytes

_FROZEN = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class StartMethod(str, Enum):
    """How DataLoader starts its workers (``multiprocessing_context``)."""

    FORK = "fork"
    SPAWN = "spawn"
    FORKSERVER = "forkserver"


class LoaderSpec(BaseModel):
    """The DataLoader and the Dataset as far as memory is concerned.

    ``num_workers`` None: report the largest and the recommended count. ``dataset`` is
    ``package.module:callable`` returning the real ``Dataset``; when given, one worker is
    started and measured instead of relying on the sample arithmetic alone.
    """

    model_config = _FROZEN

    num_workers: int | None = Field(default=None, ge=0)
    prefetch_factor: int = Field(default=2, ge=1)
    pin_memory: bool = False
    """DataLoader's ``pin_memory`` (its default is False); only effective when training on CUDA."""
    persistent_workers: bool = False
    start_method: StartMethod = StartMethod.FORK
    sample_dtype: str | None = None
    """dtype of one loaded sample; None: the model's input dtype (float32 when unknown)."""
    raw_dtype: str | None = None
    """dtype the sample is decoded to before conversion (e.g. uint8 images); None: no raw copy."""
    transform_copies: int = Field(default=0, ge=0)
    """Full-size intermediate copies a transform makes while one sample is built."""
    dataset_bytes: int = Field(default=0, ge=0)
    """RAM the Dataset object itself holds in the main process (an in-memory dataset)."""
    dataset_python_objects: bool = False
    """The dataset is made of Python objects (lists, dicts): forked workers copy it on read."""
    dataset: str | None = None
    input_key: str | None = None
    """Which field of a tuple/dict sample is the model input (default: the first tensor)."""
    probe_seconds: float = Field(default=60.0, gt=0, le=86400)
    """Wall-time budget of the measured worker run."""
    headroom_fraction: float = Field(default=0.05, ge=0.0, lt=1.0)
    """Share of the RAM limit kept free (OS, page cache, other processes)."""


class MachineSpec(BaseModel):
    """CPUs and memory limits of the node (or SLURM allocation) that runs the job."""

    model_config = _FROZEN

    cpus: int = Field(ge=1)
    ram_bytes: int = Field(gt=0)
    """Physical RAM, or the allocation's limit."""
    mem_per_cpu_bytes: int | None = Field(default=None, gt=0)
    """SLURM ``--mem-per-cpu``: the job's limit is this times ``cpus``."""
    shm_bytes: int | None = Field(default=None, gt=0)
    """Size of the ``/dev/shm`` tmpfs. Left out with ``ram_bytes`` given: Linux's default,
    half of RAM (``shm_assumed``); None: not known (only ``mem_per_cpu_bytes`` given, or not
    detected), not checked."""
    shm_assumed: bool = False
    """``shm_bytes`` is Linux's default tmpfs size for the given RAM, not given or detected."""
    source: str = "given"
    """Where the figures come from: given on the command line, or detected on this machine."""
    node_processes: int = Field(default=1, ge=1)
    """Training processes sharing the node (one per GPU of a distributed job) whose equal
    share these figures are (``shared_by``); 1: the node's own."""

    @model_validator(mode="before")
    @classmethod
    def _linux_default_shm(cls, data):
        """No ``/dev/shm`` size with the node's RAM given: Linux mounts its tmpfs at half of
        RAM (``shmem``'s default size, Documentation/filesystems/tmpfs.rst)."""
        if (isinstance(data, dict) and data.get("shm_bytes") is None
                and data.get("mem_per_cpu_bytes") is None
                and not str(data.get("source", "given")).startswith("detected")
                and isinstance(data.get("ram_bytes"), int) and data["ram_bytes"] > 1):
            return {**data, "shm_bytes": data["ram_bytes"] // 2, "shm_assumed": True}
        return data

    @property
    def detected(self) -> bool:
        """The figures are this machine's (often a login node), not a training node given."""
        return self.source.startswith("detected")

    def described(self) -> str:
        """``2 CPUs, 23.54 GiB, detected``; a share says whose."""
        share = (f", one of {self.node_processes} training processes' share of the node"
                 if self.node_processes > 1 else "")
        return f"{self.cpus} CPUs, {format_bytes(self.limit_bytes)}, {self.source}{share}"

    def shared_by(self, processes: int) -> MachineSpec:
        """One of ``processes`` training processes' equal share of this machine (one process
        per GPU, each with its own DataLoader workers): its CPUs, RAM and /dev/shm divided,
        at least one CPU each; the machine itself for one process."""
        if processes == 1:
            return self
        return self.model_copy(update={
            "cpus": max(1, self.cpus // processes),
            "ram_bytes": self.limit_bytes // processes,
            "shm_bytes": self.shm_bytes // processes if self.shm_bytes else None,
            "node_processes": self.node_processes * processes})

    @property
    def limit_bytes(self) -> int:
        """RAM the job may use: physical RAM, capped by the per-CPU allocation."""
        if self.mem_per_cpu_bytes is None:
            return self.ram_bytes
        return min(self.ram_bytes, self.mem_per_cpu_bytes * self.cpus)


def check_workers_within_cpus(loader: LoaderSpec, machine: MachineSpec | None) -> None:
    """ValueError (a pydantic validation error in a spec) when more workers than CPUs are
    asked of a machine given; one detected here (often a login node, not the training node)
    gets the host plan's warning instead, so a GPU-memory answer never fails on its CPUs."""
    workers = loader.num_workers
    if (machine is not None and workers is not None and workers > machine.cpus
            and not machine.detected):
        whose = ("the machine" if machine.node_processes == 1 else
                 f"one of the {machine.node_processes} training processes sharing the node "
                 "(one per GPU)")
        raise ValueError(f"num_workers {workers} (--num-workers) is more than the "
                         f"{machine.cpus} CPUs of {whose}; use at most that many, or "
                         "describe the training node (--cpus; machine={'cpus': N} in Python)")


class HostSpec(BaseModel):
    """One training process's host side: the sample, the batch, the loader, the machine."""

    model_config = _FROZEN

    sample_shape: tuple[int, ...] | None = None
    """One sample as the Dataset yields it; None only when ``loader.dataset`` is measured."""
    batch_size: int = Field(ge=1)
    cuda: bool = True
    """The training step runs on a GPU: CUDA's host-side context and pinned copies apply."""
    model_bytes: int = Field(default=0, ge=0)
    """Weights and buffers as loaded; the main process holds them and a state dict while
    loading, before the workers start (then on CUDA they move to the GPU)."""
    offloaded_activation_bytes: int = Field(default=0, ge=0)
    """Pinned host memory of activations offloaded from the GPU (``save_on_cpu``)."""
    offloaded_state_bytes: int = Field(default=0, ge=0)
    """An FSDP2 rank's states offloaded to host RAM (``--cpu-offload``), at their peak."""
    host_tensor_bytes: int = Field(default=0, ge=0)
    """Tensors the step itself makes in host RAM beside the batch (a sliding window's output
    aggregated on the CPU, windows gathered from a volume there), at their peak."""
    resident_worker_bytes: int = Field(default=0, ge=0)
    """Another loader's persistent workers, idle but alive while this one runs (the training
    loader's during validation)."""
    workers_needed: int | None = Field(default=None, ge=0)
    """Workers the feeding model says keep the GPU busy; None: as many as CPUs allow."""
    cpu_step_bytes: int = Field(default=0, ge=0)
    """Peak of the training step itself when it runs on the CPU (in the main process)."""
    loader: LoaderSpec = Field(default_factory=LoaderSpec)
    machine: MachineSpec

    @model_validator(mode="after")
    def _workers_within_cpus(self) -> HostSpec:
        check_workers_within_cpus(self.loader, self.machine)
        if self.sample_shape is None and self.loader.dataset is None:
            raise ValueError("the host estimate needs --shape, or --dataset to measure")
        return self

    @property
    def pin_memory(self) -> bool:
        return self.loader.pin_memory and self.cuda
