"""Feeding the GPU: does the DataLoader keep up with the training step?

Workers build batches in parallel, one at a time each, so W workers deliver W batches per
batch-build time; prefetching only absorbs jitter. With no workers the main process builds
each batch between steps, in its own memory (``main_load``: measured, it is often shorter
than a worker's, which writes the batch into shared memory). With workers the main process
takes each batch between steps (``receive``: the shared-memory handles, mapping the batch,
freeing the one before), so a step starts at most every step + receive. The pin-memory copy
is serial in the main process's pin thread.

The cores left to the job are A = C − what other processes use (none on a dedicated
training node; ``memcalc feed`` measures it). The training process is runnable for
``main_busy`` × step + receive per batch: ``main_busy`` is ``1`` for a real GPU job (kernel
launches, then CUDA's default synchronisation spins while the GPU works:
``cudaDeviceScheduleAuto`` spins when there are fewer CUDA contexts than cores), ``0`` for a
consumer that sleeps. Linux shares the cores fairly among runnable processes: on 2 cores with
two workers building, a spinning training process ran 53-76 % of its step (schedstat of each
process), and a spin that loses its core does not slow the GPU. So the W workers get
A × W / (W + 1) cores while the training process is runnable and min(W, A) while it waits for
a batch. Except where batches wait for a worker's GIL (``busy_receive`` well above
``receive``: the file-descriptor hand-over needs the GIL that a pure-Python Dataset holds):
there what fair sharing gives the workers is lost again at the receives, and the training
process keeps a whole core (pure-Python kinds at 2 workers on 2 cores: 59-61 % GPU-busy
measured; fair sharing alone predicts 72-75 %, the whole core 63-67 %; JPEG decoding, whose
hand-over is quick: 69-83 % measured, 74-85 % with fair sharing, 65-73 % with the whole core).
With u the GPU-busy share and T = step / u the time between batches:

    main(u)        = min(1, u × (main_busy × step + receive) / step)  share of time it runs
    workers(u)     = main(u) × min(W, A·W/(W+1)) + (1 − main(u)) × min(W, A)
                     (GIL-bound hand-over: min(W, A − main(u)))
    building(u)    = min(W, ⌈build / T⌉)                       workers building at a receive
    busy(u)        = clamp(building(u) − (A − 1), 0, 1)        no idle core at a receive
    utilisation(0) = step / (step + main_load / min(1, A) + pin)
    utilisation(W) = u solving u = min(1, workers(u) × step / build,
                                       step / (step + receive
                                               + ((1 − main_busy) × wake + receive) × busy(u)),
                                       step / pin)

``building`` follows the batches' rhythm: the training process sends the next index to a
worker when it takes a batch, so at each receive that worker starts a build, and the one sent
an index a batch earlier is still building when a build takes longer than T. A training
process then finds no idle core (``busy``) and takes the batch sharing a core with a worker,
which doubles the receive (not where the hand-over is GIL-bound: its whole core); one that
sleeps through the step (``main_busy`` 0; a GPU job with blocking synchronisation) first
waits for that core when its timer fires (``wake``, measured on the machine by
``memcalc.host.wake_latency``: 0.3-0.8 ms on 2 cores here). Measured on 2 cores, two
workers and a sleeping step: the training process waited for a CPU 4.7-5.2 ms a batch against
a 4.4 ms receive (3D volumes, builds longer than T), 2.3-2.8 ms against 2.4 ms (JPEG), and
0.2-0.5 ms where builds were shorter than T (slice stacks). A spinning process never sleeps
and waits for nothing.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict

from memcalc.host.report import MallocFix
from memcalc.units import counted

TARGET_UTILIZATION = 0.95
SPARE_WORKER_CAPACITY = 1.2
"""Workers enough to build batches 20 % faster than the GPU takes them: a run of batches
slower than the mean (heavier augmentation, a storage hiccup) then does not stall the GPU
(prefetching absorbs a single slow batch only), and workers that match the step exactly are
never the recommendation."""
NEAR_BEST = 0.99
"""Within this share of a ceiling counts as at it: short of the target, the fewest workers
that reach it of the best utilisation are recommended, and "main" is the verdict where the
training process's receive caps utilisation."""
PIN_COPY_BYTES_PER_S = 8e9
"""Pageable → pinned host copy, one thread (memcpy bandwidth of one core)."""
GPU_JOB_MAIN_BUSY = 1.0
"""Share of a step a real GPU training process keeps one core busy (see the module text)."""
_BISECTIONS = 50


class WorkerUtilization(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    num_workers: int
    expected_gpu_utilization: float


HEAP_RANGE_POINTS = 10
"""Heap states whose forecasts differ by more than this many points of GPU-busy share are
shown as a range on the feeding head."""


class HeapStates(BaseModel):
    """A worker that hands its temporaries back to the kernel is as fast as glibc's heap it
    inherits from the training process lets it be (``memcalc.host.probe``): measured in both
    states, forecast at the recommended ``num_workers``. The table is the training state's
    (the likely one)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    num_workers: int
    training_gpu_utilization: float
    """Workers forked from a heap as a training script leaves it (its mmap threshold raised)."""
    fresh_gpu_utilization: float
    """Workers forked from a fresh interpreter's heap (a script that starts its loader
    first)."""
    training_seconds_per_sample: float
    fresh_seconds_per_sample: float
    fixed_gpu_utilization: float | None = None
    """With glibc's two thresholds set in the job's environment (``ThroughputReport.malloc_fix``),
    where advised: the same in every heap state."""

    @property
    def spread_points(self) -> float:
        return 100 * abs(self.training_gpu_utilization - self.fresh_gpu_utilization)

    @property
    def range_text(self) -> str:
        """``38–82 %`` (lower first)."""
        low, high = sorted((self.fresh_gpu_utilization, self.training_gpu_utilization))
        return f"{low:.0%}–{high:.0%}".replace("%–", "–")


class ThroughputReport(BaseModel):
    """JSON field ``throughput``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    step_time_s: float
    step_time_source: str
    batch_load_time_s: float
    """Time one worker needs to build one batch."""
    batch_load_source: str
    workers_needed: int
    """Workers that keep the GPU ≥ 95 % busy, ignoring RAM and CPU limits."""
    num_workers: int
    """The count evaluated: the recommended one within the RAM and CPU bounds."""
    expected_gpu_utilization: float
    bound: str
    """"gpu" (the step sets the pace), "cpu" (sample building), "io" (storage reads) or
    "main" (the training process's own time to take each batch from a worker)."""
    by_workers: list[WorkerUtilization]
    advice: list[str]
    assumptions: list[str]
    malloc_fix: MallocFix | None = None
    """The worker measured again with glibc's malloc thresholds fixed, where that made it
    faster (``memcalc.host.malloc_thresholds``; in the advice, not in the table)."""
    heap_states: HeapStates | None = None
    """Where the worker's speed depends on the heap it inherits: both states' forecasts (the
    table and ``expected_gpu_utilization`` are the training state's)."""


SLOW_HANDOVER_S = 0.005
"""A batch leaving a busy worker this much (and at least the idle receive) slower than an
idle one's is reported: the worker's Python code holds the GIL that the hand-over needs. A
thread waiting for a busy GIL waits one switch interval at least (``sys.getswitchinterval()``,
5 ms by default); measured here, batches left GIL-bound workers 17-32 ms slower than idle
ones, and workers that hold no GIL while they build (numpy, Pillow, sleeping reads) 0-3 ms
slower (the busy take follows a short wait, the idle ones follow other takes)."""


def slow_handover(receive_s: float, busy_receive_s: float | None) -> bool:
    """Batches wait for a busy worker's GIL to leave it: ``receive_s`` the main process's
    time to take a batch from an idle worker, ``busy_receive_s`` from one that is building
    its next batch (None: not measured)."""
    return (busy_receive_s is not None
            and busy_receive_s - receive_s >= max(SLOW_HANDOVER_S, receive_s))


def slow_handover_warning(receive_s: float, busy_receive_s: float | None) -> str | None:
    """The warning for batches that wait for a busy worker's GIL to leave it, or None."""
    if not slow_handover(receive_s, busy_receive_s):
        return None
    return (f"a batch takes {busy_receive_s * 1e3:.3g} ms to leave a worker that is building "
            f"the next one, against {receive_s * 1e3:.3g} ms from an idle one: each tensor's "
            "file-descriptor hand-over needs the worker's GIL, which its Python code holds. "
            "With a training step that keeps a core busy, such Datasets ran up to 11 points "
            "below the prediction at 2 workers on 2 cores; "
            "torch.multiprocessing.set_sharing_strategy('file_system') removes the hand-over")


MIN_AVAILABLE_CPUS = 0.05
"""A floor for the cores left to the job, so a fully loaded machine reads as very slow rather
than as a division by zero."""


def cpu_share(runnable: float, cpus: float) -> float:
    """The part of a core each of ``runnable`` busy processes gets on ``cpus`` cores."""
    return min(1.0, cpus / runnable) if runnable > 0 else 1.0


def utilization(workers: int, step_s: float, load_s: float, cpus: int, pin_s: float = 0.0, *,
                main_busy: float = GPU_JOB_MAIN_BUSY, other_busy_cpus: float = 0.0,
                receive_s: float = 0.0, main_load_s: float | None = None,
                wake_wait_s: float = 0.0, busy_receive_s: float | None = None) -> float:
    """Share of wall time the GPU is busy with ``workers`` DataLoader workers (module text).

    ``load_s`` is one worker's time for one batch on a core of its own; ``other_busy_cpus``
    the cores other processes use meanwhile; ``receive_s`` the training process's time to
    take a ready batch from a worker; ``main_load_s`` its own time to build one (0 workers),
    ``load_s`` when not given; ``wake_wait_s`` what a training process that sleeps through
    the step waits for a core when it wakes to every core running a worker (it then also
    takes the batch sharing a core with a worker)."""
    available = max(MIN_AVAILABLE_CPUS, cpus - other_busy_cpus)
    if workers == 0:
        build_s = (load_s if main_load_s is None else main_load_s) / cpu_share(1, available)
        return step_s / (step_s + build_s + pin_s)
    main_per_step = (main_busy * step_s + receive_s) / step_s
    pinning = [step_s / pin_s] if pin_s else []
    # the workers' cores: a fair share of them beside a runnable main process, all of them
    # while it waits for a batch; where batches wait for a worker's GIL, what the fair share
    # gives the workers is lost again at each receive: the training process's whole core
    gil_bound = slow_handover(receive_s, busy_receive_s)
    # with no idle core a sleeping main process first waits for one, then (but on its whole
    # core) the receive shares a core with a worker: it takes twice as long
    crowded = (1 - main_busy) * wake_wait_s + (receive_s if not gil_bound else
                                               (1 - main_busy) * receive_s)
    beside_main = min(workers, available * workers / (workers + 1))
    alone = min(workers, available)

    def sustained(busy: float) -> float:
        main_runnable = min(1.0, main_per_step * busy)
        cores = (min(workers, max(0.0, available - main_runnable)) if gil_bound else
                 main_runnable * beside_main + (1 - main_runnable) * alone)
        # workers building when a batch is taken: the one sent the next index, and those sent
        # one a batch (step / busy) or more earlier whose build lasts longer than that
        building = min(workers, math.ceil(busy * load_s / step_s - 1e-9)) if busy > 0 else 0
        no_idle_core = min(1.0, max(0.0, building - available + 1))
        serial = step_s / (step_s + receive_s + crowded * no_idle_core)
        return min([1.0, cores * step_s / load_s, serial, *pinning])

    # sustained() falls as the GPU-busy share rises (a busier main process takes more CPU,
    # and more workers are building at each receive):
    # the one fixed point lies between 0 and 1
    if sustained(1.0) >= 1.0:
        return 1.0
    low, high = 0.0, 1.0
    for _ in range(_BISECTIONS):
        middle = (low + high) / 2
        low, high = (middle, high) if sustained(middle) > middle else (low, middle)
    return (low + high) / 2


def feeding_report(step_s: float, step_source: str, load_s: float, load_source: str, *,
                   max_workers: int, cpus: int, batch_bytes: int, pin_memory: bool,
                   receive_s: float = 0.0, busy_receive_s: float | None = None,
                   main_load_s: float | None = None) -> ThroughputReport:
    """Utilisation per worker count; the smallest count reaching 95 % within ``max_workers``.
    ``receive_s``: the training process's measured time to take a batch from an idle worker
    (0: not measured); ``busy_receive_s`` from one building its next batch; ``main_load_s``
    its own time to build a batch with no workers (None: a worker's, ``load_s``)."""
    pin_s = batch_bytes / PIN_COPY_BYTES_PER_S if pin_memory else 0.0
    needed = max(1, math.ceil(SPARE_WORKER_CAPACITY * load_s / step_s - 1e-9))
    table = [WorkerUtilization(num_workers=w, expected_gpu_utilization=utilization(
        w, step_s, load_s, cpus, pin_s, receive_s=receive_s, main_load_s=main_load_s,
        busy_receive_s=busy_receive_s))
        for w in range(max_workers + 1)]
    reaching = [row.num_workers for row in table
                if row.expected_gpu_utilization >= TARGET_UTILIZATION]
    # short of the target: the fewest workers near the best (more only cost RAM where the
    # CPUs or the training process's receive set the pace)
    best = max(row.expected_gpu_utilization for row in table)
    chosen = reaching[0] if reaching else next(
        row.num_workers for row in table if row.expected_gpu_utilization >= NEAR_BEST * best)
    # where the workers keep the GPU busy, capacity to spare (if it costs no utilisation);
    # short of that, the CPUs or the receive set the pace and more workers only cost RAM
    spare = min(needed, max_workers)
    if reaching and spare > chosen and (table[spare].expected_gpu_utilization
                                        >= table[chosen].expected_gpu_utilization):
        chosen = spare
    expected = table[chosen].expected_gpu_utilization
    bound = _bound(expected, step_s / (step_s + receive_s), load_source)
    handover = slow_handover_warning(receive_s, busy_receive_s)
    taking = (f"taking a batch from a worker costs the training process {receive_s * 1e3:.3g} "
              "ms (measured in the probe)" if receive_s else
              "taking a batch from a worker costs the training process no time")
    building = (f"with 0 workers the training process builds a batch in {main_load_s * 1e3:.3g} "
                "ms (measured in the probe's own process)" if main_load_s is not None else
                "with 0 workers the training process builds a batch as fast as a worker")
    return ThroughputReport(
        step_time_s=step_s, step_time_source=step_source, batch_load_time_s=load_s,
        batch_load_source=load_source, workers_needed=needed, num_workers=chosen,
        expected_gpu_utilization=expected, bound=bound, by_workers=table,
        advice=_advice(bound, needed, max_workers, expected, pin_s, step_s, receive_s)
        + ([handover] if handover else []),
        assumptions=[
            "workers build batches in parallel, one each at a time; prefetch absorbs jitter "
            f"only; with 0 workers loading and the step alternate ({building}); workers "
            f"enough to build {SPARE_WORKER_CAPACITY - 1:.0%} faster than the GPU takes "
            "batches are needed, so that slower batches do not stall it",
            f"{cpus} CPUs: the training process runs through its step (kernel launches, then "
            "CUDA's spin-wait synchronisation) and shares the cores fairly with the workers ("
            + ("it keeps a whole core: batches wait for a busy worker's GIL"
               if slow_handover(receive_s, busy_receive_s) else
               "a spin that loses its core does not slow the GPU")
            + f"); {taking}; no other load on the node",
            "pin-memory copy at 8 GB/s in one thread" if pin_memory else "no pinning",
        ])


def _bound(expected: float, serial_ceiling: float, load_source: str) -> str:
    """What sets the pace at the chosen worker count: "main" where the training process's
    own receive caps utilisation whatever the workers (within 1 % of that cap)."""
    if expected >= TARGET_UTILIZATION:
        return "gpu"
    if expected >= NEAR_BEST * serial_ceiling:
        return "main"
    return "io" if load_source.startswith("read") else "cpu"


def _advice(bound: str, needed: int, max_workers: int, expected: float, pin_s: float,
            step_s: float, receive_s: float = 0.0) -> list[str]:
    if bound == "gpu":
        return []
    if bound == "main":
        return [f"the training process spends {receive_s * 1e3:.3g} ms taking each batch from a "
                "worker (mapping its shared memory, freeing the one before), so the GPU is busy "
                f"about {expected:.0%} of the time whatever the workers: send smaller tensors "
                "(uint8 or float16, normalised on the GPU)"]
    limit = (f"at most {max_workers} fit the CPUs and RAM" if needed > max_workers else
             "the CPUs they would each need are shared with the training process")
    lines = [f"{bound.upper()}-bound: {counted(needed, 'worker')} would keep the GPU busy "
             f"({SPARE_WORKER_CAPACITY - 1:.0%} to spare) but "
             f"{limit}; the GPU is busy about {expected:.0%} of the "
             f"time ({1 / expected:.1f}× the GPU-bound step time)"]
    if pin_s and pin_s > step_s:
        lines.append("the pin-memory copy alone is slower than the step: send uint8 and "
                     "normalise on the GPU, or drop pin_memory")
    if bound == "io":
        lines.append("storage sets the pace: cache decoded samples on local NVMe or in RAM, "
                     "or store them smaller (uint8, compressed chunks)")
    else:
        lines.append("move augmentation to the GPU (DALI, kornia, torchvision.transforms.v2 on "
                     "CUDA tensors), transfer uint8 and normalise on the GPU, cache decoded "
                     "samples, or ask for more CPUs")
    return lines
