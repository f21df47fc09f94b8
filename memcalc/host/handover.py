"""The training process's time to take a batch from a DataLoader worker (the one before
freed): from an idle worker, and from one that is building its next batch. A batch's tensors
reach the main process as file descriptors that a thread in the worker hands over, so a
worker whose Python code holds the GIL hands them over late (``feed.model``'s warning).

A take is timed right after another take, never right after a long wait: on some virtual
machines a process's first steps after a tenth of a second cost milliseconds (measured here,
a Firecracker guest: ``sum(range(1000))`` took 0.01 ms in a loop and 0.4-0.7 ms after a
130 ms sleep or spin; a take from an idle worker 10-13 ms after such a wait, 1-2 ms right
after another take). A training loop takes its batches every step, so the back-to-back
figure is the one it pays."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Iterator
from functools import partial
from typing import NamedTuple

from torch.utils.data import DataLoader, Subset

from memcalc.host.machine import core_seconds

BUILD_SLACK = 2.0
"""How many times the workers' own batch time an idle-receive loader waits for them to
build its batches (a loaded machine builds them more slowly)."""
WORKER_START_S = 0.01
"""Added to that wait for the workers' start (their first batch is already taken)."""


class Handover(NamedTuple):
    receive_s: float
    """From an idle worker: the median, with this process's waits for a CPU taken out."""
    busy_receive_s: float
    """From a worker that is building its next batch: the median."""


def idle_receive_s(dataset, batch_size: int, workers: int, batch_s: float, rounds: int,
                   **loader_options) -> float | None:
    """The median time to take a batch from an idle worker, over ``rounds`` batches (None
    where the dataset holds fewer than ``rounds + 2`` of them): a loader of ``workers`` whose
    sampler holds ``rounds + 2`` batches, all requested at once, so that no take sends a
    worker a new index. The first take waits for the workers to start and build it; once
    they have had ``BUILD_SLACK`` × their time for the rest, a second is taken untimed (this
    process's return from the wait) and the others back to back."""
    count = rounds + 2
    if len(dataset) < count * batch_size:
        return None
    per_worker = math.ceil(count / workers)
    loader = DataLoader(Subset(dataset, range(count * batch_size)), batch_size=batch_size,
                        num_workers=workers, prefetch_factor=per_worker, **loader_options)
    batches = iter(loader)
    next(batches)
    time.sleep(_build_wait_s(batch_s, per_worker))
    next(batches)
    timed = median_take(batches, rounds)
    del batches     # the workers end here
    return timed


def idle_receive_budget_s(batch_s: float, rounds: int, workers: int = 1) -> float:
    """The wall time ``idle_receive_s`` waits for its workers' batches."""
    return batch_s + _build_wait_s(batch_s, math.ceil((rounds + 2) / workers))


def _build_wait_s(batch_s: float, per_worker: int) -> float:
    """The wait, after the first take, for the rest of each worker's batches to be built."""
    return BUILD_SLACK * (per_worker - 1) * batch_s + WORKER_START_S


def busy_receive_s(batches: Iterator, wait_s: float, rounds: int, building_s: float) -> float:
    """The median over ``rounds`` on a one-worker loader's iterator: wait ``wait_s`` (long
    enough for the worker's prefetched batches to be ready and the worker idle), take one
    batch untimed, wait ``building_s`` (the worker is now building the batch that take asked
    for: a part of its batch time, so that it has started even on a loaded machine), take the
    next. Raises StopIteration at the dataset's end."""
    busy = []
    for _ in range(rounds):
        time.sleep(wait_s)
        next(batches)
        busy.append(_take(batches, building_s))
    return statistics.median(busy)


def median_take(batches: Iterator, rounds: int, wait_s: float = 0.0) -> float:
    """Median time to take the next batch with a core to itself, ``rounds`` times, each after
    waiting ``wait_s``: from workers all done and idle, or built by this process itself (a
    loader with no workers, no wait)."""
    return statistics.median(_take(batches, wait_s) for _ in range(rounds))


def _take(batches: Iterator, wait_s: float) -> float:
    """Wait ``wait_s``, then the time to take the next batch with a core to itself."""
    if wait_s > 0:
        time.sleep(wait_s)
    return core_seconds(partial(next, batches))
