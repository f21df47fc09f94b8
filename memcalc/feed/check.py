"""``memcalc feed``: the real DataLoader against a simulated GPU step, measured GPU
utilisation per worker count next to the feeding model's, on this machine as loaded now.

Each worker count is predicted with the load other processes put on the CPUs while it was
measured (``host.machine.OtherLoad``). The simulated step either sleeps (a process that waits
without using a core) or spins for the step time (a training process whose CUDA
synchronisation spin-waits, the default).

The prediction takes the worker's time per sample from the probe and measures, before the
runs, what the main process itself spends per batch (``main_process_costs``): building one
with no workers, and taking one a worker has ready."""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

from pydantic import BaseModel, ConfigDict
from torch.utils.data import DataLoader

from memcalc.errors import InputError
from memcalc.feed.model import utilization
from memcalc.host.machine import OtherLoad, cpu_wait_seconds
from memcalc.host.wake_latency import wake_wait_s
from memcalc.model.user_code import load_dataset

WARMUP_BATCHES = 2
COST_BATCHES = 6
"""Batches timed for each of the main process's own costs (after WARMUP_BATCHES + 1 untimed)."""
BUILD_ROUNDS = 3
"""Separate rounds of COST_BATCHES whose median is the main process's build time."""


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class Consumer(NamedTuple):
    """A simulated step: how it passes its time, and the share of it the main process keeps
    a core busy (what the feeding model is told)."""

    step: Callable[[float], None]
    main_busy: float


CONSUMERS = {"sleep": Consumer(time.sleep, 0.0), "spin": Consumer(_spin, 1.0)}


class MainCosts(NamedTuple):
    build_s: float
    """Building one batch in the main process (0 workers): the median of BUILD_ROUNDS
    rounds' medians over COST_BATCHES."""
    receive_s: float
    """Taking one batch a worker has ready, the one before freed, the worker idle: the median."""
    busy_receive_s: float
    """The same while the worker builds its next batch: the median."""


SLOW_HANDOVER_S = 0.002
"""A batch leaving a busy worker this much (and at least the idle receive) slower than an
idle one's is reported: the worker's Python code holds the GIL that the hand-over needs."""


def main_process_costs(dataset, batch_size: int, worker_batch_s: float) -> MainCosts:
    """The main process's own time per batch, each timed alone (no step) after a warm-up:
    building batches itself (the median of ``BUILD_ROUNDS`` separate rounds, so that one
    disturbed round cannot move every 0-worker prediction), then taking them from one worker,
    waiting twice the longer build time first so that two batches are ready: the first is
    taken from an idle worker, the second right after, while the worker builds the next."""
    build = statistics.median(
        _median_next(DataLoader(dataset, batch_size=batch_size, num_workers=0), 0.0)
        for _ in range(BUILD_ROUNDS))
    wait_s = 2 * max(build, worker_batch_s) + 0.005
    loader = DataLoader(dataset, batch_size=batch_size, num_workers=1, prefetch_factor=2)
    idle, busy = _median_next(loader, wait_s, then_at_once=True)
    return MainCosts(build, idle, busy)


def _median_next(loader: DataLoader, wait_s: float, then_at_once: bool = False):
    """Median time of ``next`` on the loader after WARMUP_BATCHES untimed ones (a fresh
    process's first batches of numpy or Pillow work run slower), less this process's waits
    for a CPU (from ``/proc/PID/schedstat``, as the probe does for the worker): its time with
    a core to itself, which the model shares out with the load measured during each run.
    ``then_at_once``: each timed ``next`` after the wait is followed by a second one at once,
    and the medians of both are returned."""
    iterator, thread = iter(loader), threading.get_native_id()
    for _ in range(WARMUP_BATCHES):
        next(iterator)
    batch, first, second = next(iterator), [], []

    def timed() -> float:
        nonlocal batch
        start, waited = time.perf_counter(), cpu_wait_seconds(thread)
        del batch       # freeing the previous batch is the training loop's cost too
        batch = next(iterator)
        elapsed, after = time.perf_counter() - start, cpu_wait_seconds(thread)
        return elapsed - (after - waited if None not in (waited, after) else 0.0)

    for _ in range(COST_BATCHES):
        time.sleep(wait_s)
        first.append(timed())
        if then_at_once:
            second.append(timed())
    del batch, iterator
    if then_at_once:
        return statistics.median(first), statistics.median(second)
    return statistics.median(first)


def slow_handover_warning(costs: MainCosts) -> str | None:
    """The warning for batches that wait for a busy worker's GIL to leave it, or None."""
    extra = costs.busy_receive_s - costs.receive_s
    if extra < max(SLOW_HANDOVER_S, costs.receive_s):
        return None
    return (f"a batch takes {costs.busy_receive_s * 1e3:.3g} ms to leave a worker that is "
            f"building the next one, against {costs.receive_s * 1e3:.3g} ms from an idle one: "
            "each tensor's file-descriptor hand-over needs the worker's GIL, which its Python "
            "code holds; with a training step that keeps a core busy this can cost 10 points "
            "of GPU time that the prediction does not count. "
            "torch.multiprocessing.set_sharing_strategy('file_system') removes the hand-over")


class FeedRow(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    num_workers: int
    predicted_gpu_utilization: float
    measured_gpu_utilization: float
    other_busy_cpus: float = 0.0
    """Cores other processes kept busy while this count was measured; the prediction shares
    the CPUs with them."""


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
    """The main process's time to build a batch itself (``main_process_costs``), what the
    0-worker prediction uses; None: the worker's time stood in."""
    receive_s: float = 0.0
    """The main process's time to take a ready batch from an idle worker."""
    busy_receive_s: float = 0.0
    """The same while the worker builds its next batch (not in the prediction)."""
    warnings: list[str] = []
    wake_wait_s: float = 0.0
    """What a sleeping step waits for a core when it wakes to every core busy, measured on
    this machine before the runs (``memcalc.host.wake_latency``; ``wake_wait_source`` says
    how)."""
    wake_wait_source: str = ""


def measured_utilization(dataset, batch_size: int, workers: int, step_s: float,
                         batches: int, consumer: str = "sleep") -> tuple[float, float]:
    """Share of wall time the simulated GPU (one step per batch) is busy after warm-up, and
    the cores other processes kept busy meanwhile."""
    step = CONSUMERS[consumer].step
    loader = DataLoader(dataset, batch_size=batch_size, num_workers=workers, shuffle=False)
    iterator = iter(loader)
    for _ in range(WARMUP_BATCHES + workers):     # worker start-up and queue fill
        next(iterator)
        step(step_s)
    with OtherLoad() as others:
        start = time.perf_counter()
        for _ in range(batches):
            next(iterator)
            step(step_s)
        elapsed = time.perf_counter() - start
    del iterator
    return batches * step_s / elapsed, others.busy_cpus


def feed_check(reference: str, batch_size: int, step_s: float, worker_counts: list[int], *,
               seconds_per_sample: float, cpus: int, batches: int = 20, consumer: str = "spin",
               progress: Callable[[int], None] | None = None) -> FeedCheck:
    if consumer not in CONSUMERS:
        raise InputError(f"consumer {consumer!r} is not one of {', '.join(CONSUMERS)}")
    dataset = load_dataset(reference)
    needed = max(WARMUP_BATCHES + max(worker_counts) + batches,
                 WARMUP_BATCHES + 1 + 2 * COST_BATCHES) * batch_size
    if len(dataset) < needed:
        raise InputError(f"dataset {reference!r} has {len(dataset)} samples; the check needs "
                         f"{needed} ((warm-up + largest --workers + --batches) × batch size, at "
                         f"least {WARMUP_BATCHES + 1 + 2 * COST_BATCHES} batches); lower "
                         "--batches or --workers")
    costs = main_process_costs(dataset, batch_size, seconds_per_sample * batch_size)
    wake_s, wake_source = wake_wait_s(cpus) if consumer == "sleep" else (0.0, "")
    rows = []
    for workers in worker_counts:
        measured, others = measured_utilization(dataset, batch_size, workers, step_s, batches,
                                                consumer)
        rows.append(FeedRow(
            num_workers=workers, measured_gpu_utilization=measured, other_busy_cpus=others,
            predicted_gpu_utilization=utilization(
                workers, step_s, seconds_per_sample * batch_size, cpus,
                main_busy=CONSUMERS[consumer].main_busy, other_busy_cpus=others,
                receive_s=costs.receive_s, main_load_s=costs.build_s,
                wake_wait_s=wake_s)))
        if progress:
            progress(workers)
    return FeedCheck(dataset=reference, batch_size=batch_size, step_time_s=step_s,
                     seconds_per_sample=seconds_per_sample, cpus=cpus, consumer=consumer,
                     rows=rows, main_build_s=costs.build_s, receive_s=costs.receive_s,
                     busy_receive_s=costs.busy_receive_s,
                     warnings=[w for w in [slow_handover_warning(costs)] if w],
                     wake_wait_s=wake_s, wake_wait_source=wake_source)
