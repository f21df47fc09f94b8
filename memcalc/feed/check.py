"""``memcalc feed``: the real DataLoader against a simulated GPU step, measured GPU
utilisation per worker count next to the feeding model's, on this machine as loaded now.

Each worker count is predicted with the load other processes put on the CPUs while it was
measured (``host.machine.OtherLoad``). The simulated step either sleeps (a process that waits
without using a core) or spins for the step time (a training process whose CUDA
synchronisation spin-waits, the default).

The prediction takes the worker's time per sample from the probe and measures what the main
process itself spends per batch on each run's own loader just before its timed batches:
building one with no workers, taking one from an idle worker with workers. ``handover``
also times, once, taking one from a worker that is building its next (the GIL warning)."""

from __future__ import annotations

import contextlib
import gc
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import NamedTuple

from pydantic import BaseModel, ConfigDict
from torch.utils.data import DataLoader

from memcalc.process_defaults import caller_process_kept
from memcalc.trace._torch_internals import dataloader_signals_kept
from memcalc.errors import InputError
from memcalc.feed.model import slow_handover_warning, utilization
from memcalc.host.handover import Handover, busy_receive_s, idle_receive_s, median_take
from memcalc.host.machine import OtherLoad
from memcalc.host.wake_latency import spin, wake_wait_s
from memcalc.model.user_code import load_dataset

WARMUP_BATCHES = 2
COST_BATCHES = 6
"""Batches timed for each hand-over from a worker (after WARMUP_BATCHES + 1 untimed)."""
BUILD_BATCHES = 18
"""Batches the main process builds, timed alone, right before the 0-worker run's timed ones."""
RECEIVE_BATCHES = 6
"""Batches taken from idle workers, timed, right before a run with workers
(``host.handover.idle_receive_s``, a loader of the run's worker count)."""


class Consumer(NamedTuple):
    """A simulated step: how it passes its time, and the share of it the main process keeps
    a core busy (what the feeding model is told)."""

    step: Callable[[float], None]
    main_busy: float


CONSUMERS = {"sleep": Consumer(time.sleep, 0.0), "spin": Consumer(spin, 1.0)}


def handover(dataset, batch_size: int, worker_batch_s: float) -> Handover:
    """On one worker: from the idle worker (``idle_receive_s``, COST_BATCHES takes), and from
    the worker building its next batch after WARMUP_BATCHES + 1 untimed batches, COST_BATCHES
    times, each after three of the worker's batch times (its two prefetched batches ready)."""
    idle = idle_receive_s(dataset, batch_size, 1, worker_batch_s, COST_BATCHES)
    iterator = iter(DataLoader(dataset, batch_size=batch_size, num_workers=1, prefetch_factor=2))
    for _ in range(WARMUP_BATCHES + 1):
        next(iterator)
    busy = busy_receive_s(iterator, 3 * worker_batch_s + 0.005, COST_BATCHES, worker_batch_s / 4)
    del iterator
    return Handover(idle, busy)


class FeedRow(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    num_workers: int
    predicted_gpu_utilization: float
    measured_gpu_utilization: float
    other_busy_cpus: float = 0.0
    """Cores other processes kept busy while this count was measured; the prediction shares
    the CPUs with them."""
    receive_s: float | None = None
    """With workers: the main process's time to take a batch from an idle worker, timed on
    this count's workers right before its run (``Run.receive_s``), what its prediction uses."""


class FeedCheck(BaseModel):
    """Measured against predicted utilisation of a simulated GPU."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    dataset: str
    batch_size: int
    step_time_s: float
    seconds_per_sample: float
    """From a separate real-worker measurement (``memcalc.host.probe``): the worker's time per
    sample with a core to itself, which the model shares among the job's processes."""
    cpus: int
    consumer: str
    """How the simulated step passes its time: ``sleep`` or ``spin``."""
    rows: list[FeedRow]
    main_build_s: float | None = None
    """The main process's time to build a batch itself, timed alone just before the 0-worker
    run (``Run.main_build_s``), what its prediction uses; None without a 0-worker row."""
    receive_s: float = 0.0
    """The main process's time to take a ready batch from an idle worker (``handover``, one
    worker; each row's prediction uses its own run's, ``FeedRow.receive_s``)."""
    busy_receive_s: float = 0.0
    """The same while the worker builds its next batch (not in the prediction)."""
    warnings: list[str] = []
    wake_wait_s: float = 0.0
    """What a sleeping step waits for a core when it wakes to every core busy, measured on
    this machine before the runs (``memcalc.host.wake_latency``; ``wake_wait_source`` says
    how)."""
    wake_wait_source: str = ""


class Run(NamedTuple):
    utilization: float
    """Share of wall time the simulated GPU is busy over the timed batches."""
    other_busy_cpus: float
    """Cores other processes kept busy meanwhile."""
    main_build_s: float | None
    """With no workers: the main process's time to build a batch, the median of
    BUILD_BATCHES timed alone (no step) on the same loader just before the timed batches,
    so that both see the process in the same state (glibc's heap serving large arrays or
    mapping fresh pages for them moved it between 12 and 27 ms from process to process)."""
    receive_s: float | None
    """With workers: the main process's time to take a batch from an idle worker, the median
    of RECEIVE_BATCHES taken back to back from as many workers right before the run
    (``host.handover.idle_receive_s``: taken after a wait, the same batches cost 5-10 times
    more on this virtual machine)."""


def measured_utilization(dataset, batch_size: int, workers: int, step_s: float,
                         batches: int, consumer: str = "sleep", worker_batch_s: float = 0.0
                         ) -> Run:
    """The simulated GPU (one step per batch) after warm-up, on a real DataLoader.
    ``worker_batch_s``: a worker's time per batch, how long the idle receive waits."""
    step = CONSUMERS[consumer].step
    receive_s = (idle_receive_s(dataset, batch_size, workers, worker_batch_s, RECEIVE_BATCHES)
                 if workers else None)
    loader = DataLoader(dataset, batch_size=batch_size, num_workers=workers, shuffle=False)
    iterator = iter(loader)
    steps = partial(_steps, iterator, step, step_s)
    steps(WARMUP_BATCHES + workers)     # worker start-up and queue fill
    build_s = median_take(iterator, BUILD_BATCHES) if workers == 0 else None
    with OtherLoad() as others:
        start = time.perf_counter()
        steps(batches)
        elapsed = time.perf_counter() - start
    del steps, iterator     # the workers end here, not after the return
    return Run(batches * step_s / elapsed, others.busy_cpus, build_s, receive_s)


def _steps(batches, step: Callable[[float], None], step_s: float, count: int) -> None:
    """``count`` training steps: take a batch, then the simulated step."""
    for _ in range(count):
        next(batches)
        step(step_s)


def feed_check(reference: str, batch_size: int, step_s: float, worker_counts: list[int], *,
               seconds_per_sample: float, cpus: int, batches: int = 20, consumer: str = "spin",
               progress: Callable[[int], None] | None = None, dataset=None) -> FeedCheck:
    """The real DataLoader of ``reference`` at each worker count against a simulated step;
    the caller's random streams, start method, ``sys.path`` and SIGCHLD handler are left
    as they were (``memcalc.process_defaults``). ``dataset``: the one ``check_feed_dataset``
    already loaded and checked (else it is loaded here)."""
    with caller_process_kept(), dataloader_signals_kept(), _loader_threads_ended():
        return _feed_check(reference, batch_size, step_s, worker_counts,
                           seconds_per_sample=seconds_per_sample, cpus=cpus, batches=batches,
                           consumer=consumer, progress=progress, dataset=dataset)


@contextlib.contextmanager
def _loader_threads_ended(timeout_s: float = 10.0):
    """The DataLoaders' queues let go (collected) and their feeder threads waited for, so
    no thread or pipe of theirs outlives the call."""
    before = set(threading.enumerate())
    try:
        yield
    finally:
        gc.collect()
        deadline = time.monotonic() + timeout_s
        for thread in set(threading.enumerate()) - before:
            thread.join(max(0.0, deadline - time.monotonic()))


def check_feed_dataset(reference: str, batch_size: int, worker_counts: list[int],
                       batches: int):
    """The dataset, when it holds enough samples for the check (raises InputError before
    anything is measured otherwise)."""
    dataset = load_dataset(reference)
    needed = max(WARMUP_BATCHES + max(worker_counts) + batches, RECEIVE_BATCHES + 2,
                 WARMUP_BATCHES + BUILD_BATCHES + batches if 0 in worker_counts else 0,
                 WARMUP_BATCHES + 3 + 2 * COST_BATCHES) * batch_size
    if len(dataset) < needed:
        raise InputError(f"dataset {reference!r} has {len(dataset)} samples; the check needs "
                         f"{needed} ((warm-up + largest --workers + --batches) × batch size, "
                         f"more at 0 workers, at least {WARMUP_BATCHES + 3 + 2 * COST_BATCHES} "
                         "batches); lower --batches or --workers")
    return dataset


def _feed_check(reference: str, batch_size: int, step_s: float, worker_counts: list[int], *,
                seconds_per_sample: float, cpus: int, batches: int, consumer: str,
                progress: Callable[[int], None] | None, dataset) -> FeedCheck:
    if consumer not in CONSUMERS:
        raise InputError(f"consumer {consumer!r} is not one of {', '.join(CONSUMERS)}")
    if dataset is None:
        dataset = check_feed_dataset(reference, batch_size, worker_counts, batches)
    taking = handover(dataset, batch_size, seconds_per_sample * batch_size)
    wake_s, wake_source = wake_wait_s(cpus) if consumer == "sleep" else (0.0, "")
    rows, main_build_s = [], None
    for workers in worker_counts:
        run = measured_utilization(dataset, batch_size, workers, step_s, batches, consumer,
                                   seconds_per_sample * batch_size)
        main_build_s = run.main_build_s if workers == 0 else main_build_s
        rows.append(FeedRow(
            num_workers=workers, measured_gpu_utilization=run.utilization,
            other_busy_cpus=run.other_busy_cpus, receive_s=run.receive_s,
            predicted_gpu_utilization=utilization(
                workers, step_s, seconds_per_sample * batch_size, cpus,
                main_busy=CONSUMERS[consumer].main_busy, other_busy_cpus=run.other_busy_cpus,
                receive_s=run.receive_s or 0.0, main_load_s=run.main_build_s,
                wake_wait_s=wake_s, busy_receive_s=taking.busy_receive_s)))
        if progress:
            progress(workers)
    return FeedCheck(dataset=reference, batch_size=batch_size, step_time_s=step_s,
                     seconds_per_sample=seconds_per_sample, cpus=cpus, consumer=consumer,
                     rows=rows, main_build_s=main_build_s, receive_s=taking.receive_s,
                     busy_receive_s=taking.busy_receive_s,
                     warnings=[w for w in [slow_handover_warning(*taking)] if w],
                     wake_wait_s=wake_s, wake_wait_source=wake_source)
